"""Long-RewardBench evaluation CLI: ``python -m longrm_jax.evaluate --model-path DIR --data-path DIR``.

Flags shared with upstream LongRM's ``evaluate/eval.py`` keep their meaning (``--model-path``,
``--data-path``, ``--is-disrm``, ``--save-path``); the rest are ours. See ``--help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from longrm_jax.cli_support import ExitStatus, InputError, configure_logging, run_cli, silence_absl_warnings
from longrm_jax.compile_cache import enable_compilation_cache
from longrm_jax.flag_files import parse_with_config
# The flags live in evaluation/cli_args.py; the names tests and users reach through this module stay here.
from longrm_jax.evaluation.cli_args import (DEFAULT_MAX_NEW_TOKENS, apply_gpu_decode_flags, build_parser,
                                            check_args, parse_mesh, replica_argv)  # noqa: F401 - parse_mesh re-exported
from longrm_jax.parallel.topology import program_budget
from longrm_jax.xla_flags import add_gpu_xla_flags

# The evaluator's heavy modules (the runner, models, HF loading: transformers and jax programs) are imported inside
# the functions that use them, so that `--help` and a refused flag answer without loading them.


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_evaluate, argv)


def _evaluate(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parse_with_config(parser, argv)
    # Ours at INFO; jax's backend probing only from WARNING up; tokamax's per-shape autotuning-cache misses (absl)
    # not at all, as in train.
    configure_logging()
    silence_absl_warnings()
    if args.compile_only or args.topology:
        return _compile_only(args)
    if not args.data_path:
        parser.error("the following arguments are required: --data-path")
    check_args(args)
    from longrm_jax.ops import slow_paths

    slow_paths.set_strict(args.strict_kernels)
    apply_gpu_decode_flags(args)  # before anything below touches a device
    enable_compilation_cache(args.compilation_cache)
    from longrm_jax.evaluation.outputs import format_summary, truncation_line
    from longrm_jax.evaluation.runner import USER_ERRORS, run_evaluation

    cfg = eval_config(args)
    try:
        summary = run_evaluation(cfg, replica_argv(parser, args))
    except USER_ERRORS as error:  # bad data / model dir: one clear line, no traceback
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return ExitStatus.INPUT_REFUSED
    except KeyboardInterrupt:
        print(f"interrupted: the predictions made so far are in {cfg.resolved_save_path()}; the same command with "
              "--resume continues from them", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    print(format_summary(summary))  # the runner has logged a warning above UNPARSABLE_WARN_SHARE
    for line in (truncation_line(summary, cfg.max_length), slow_paths.summary_line()):
        if line:
            print(line)
    print(f"outputs written to {cfg.resolved_save_path()}")
    return NO_VERDICT_EXIT if not args.allow_no_verdicts and no_verdict_parsed(summary) else 0


def eval_config(args: argparse.Namespace):
    """The run's ``EvalConfig`` from the parsed flags (also how training judges its held-out verdicts:
    longrm_jax.held_out_judge)."""
    from longrm_jax.evaluation.runner import EvalConfig

    return EvalConfig(
        model_path=args.model_path, data_path=args.data_path, save_path=args.save_path, is_disrm=args.is_disrm,
        tasks=args.tasks, max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS, both_orders=args.both_orders,
        batch_size=args.batch_size, max_batch_tokens=args.max_batch_tokens, mesh=args.mesh,
        static_batches=args.static_batches, queue=args.queue, decode_chunk=args.decode_chunk, decode_attention=args.decode_attention,
        unroll_decode_layers=args.unroll_decode_layers,
        device_memory_gib=args.device_memory_gib, simulate_judgement_lengths=args.simulate_judgement_lengths,
        max_length=None if args.no_truncate else args.max_length, seed=args.seed, dtype=args.dtype,
        limit=args.limit, share_prompt=args.share_prompt, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress and sys.stderr.isatty(),
        task_types=args.task_types, longform_protocol=args.longform_protocol, chat_template=args.chat_template,
        longform_max_new_tokens=args.max_new_tokens, replicas=args.replicas,
        replica_max_tokens=args.replica_max_tokens,
        only_samples=_read_share(args.only_samples),
    )


def _read_share(path: str | None) -> list[str] | None:
    """A replica's share: the ``file:row`` places of its samples (evaluation.replicas writes the file)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


# Exit status of a GRM evaluation none of whose judgements held a verdict: its results measure nothing (every
# score 0, AUC 0.5), which a pipeline must not take for success. The outputs are still written, to look at;
# --allow-no-verdicts (benchmarks of random weights) exits 0.
NO_VERDICT_EXIT = 3


def no_verdict_parsed(summary: dict) -> bool:
    """Whether ``summary`` holds judgements and none parsed (then an error line says so on stderr)."""
    verdicts = summary.get("unparsable_verdicts")
    if not verdicts or not verdicts["judgements"] or verdicts["unparsable"] < verdicts["judgements"]:
        return False
    print(f"error: none of the {verdicts['judgements']} judgements held a parsable verdict (exit status "
          f"{NO_VERDICT_EXIT}): the results measure nothing. Is the model a trained generative judge, and is "
          "--max-new-tokens large enough? See the 'output' field of predictions.jsonl", file=sys.stderr)
    return True


def _compile_model_config(args: argparse.Namespace):
    """(model config, dtype) for ``--compile-only``: the model directory's config, or a preset's with its own
    vocabulary."""
    head = "classifier" if args.is_disrm else "causal_lm"
    if os.path.isdir(args.model_path):
        from longrm_jax.hf.load import read_hf_config
        from longrm_jax.models.config import from_hf_config

        mcfg = from_hf_config(read_hf_config(args.model_path), head=head)
    else:
        from longrm_jax.models.config import ModelConfig
        from longrm_jax.training.model_setup import PRESETS

        if args.model_path not in PRESETS or "vocab_size" not in PRESETS[args.model_path]:
            raise ValueError(f"--model-path {args.model_path}: not a directory nor a preset with its own "
                             f"vocabulary ({', '.join(k for k, v in PRESETS.items() if 'vocab_size' in v)})")
        mcfg = ModelConfig(**PRESETS[args.model_path]).replace(head=head)
    dtype = args.dtype
    if dtype == "auto":  # as a run resolves it (runner.resolve_dtype); a preset has no stored dtype: bfloat16
        from longrm_jax.evaluation.runner import EvalConfig, resolve_dtype

        dtype = (resolve_dtype(EvalConfig(model_path=args.model_path, data_path="", is_disrm=args.is_disrm))
                 if os.path.isdir(args.model_path) else "bfloat16")
    mcfg = mcfg.replace(dtype=dtype, param_dtype=dtype)
    return mcfg, dtype


def _compile_only(args: argparse.Namespace) -> int:
    """``--compile-only --topology NAME`` (evaluation.compile_only): 0 when every program fits, 4 otherwise."""
    if not (args.compile_only and args.topology):
        raise InputError("--compile-only and --topology go together (e.g. --compile-only --topology v5p-8)")
    from longrm_jax.parallel.topology import parse, prepare_host_for_compile_only

    topology = parse(args.topology, args.topology_slices)
    prepare_host_for_compile_only()
    if topology.platform == "gpu" and not args.is_disrm and not args.no_gpu_flags:
        add_gpu_xla_flags()  # what a GRM run on a GPU sets
    from longrm_jax.evaluation.compile_only import compile_programs
    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.parallel.topology import GiB, host_count

    mcfg, dtype = _compile_model_config(args)
    devices = topology.devices()
    mesh = make_mesh(**(args.mesh or {"fsdp": -1}), devices=devices)
    length = args.compile_length or args.max_length
    rows = args.batch_size or 1
    print(f"topology {topology.label}: {topology.chips} x {topology.chip.device_kind} ({host_count(devices)} "
          f"host(s)), {topology.chip.hbm_bytes / GiB:.1f} GiB HBM per chip; compile only, nothing runs")
    print("mesh " + " x ".join(f"{k} {v}" for k, v in mesh.shape.items()) + f"; {'DisRM' if args.is_disrm else 'GRM'} "
          f"{mcfg.num_layers} layers, hidden {mcfg.hidden_size}, {dtype}; {rows} row(s) x {length} tokens")
    reports = compile_programs(mcfg, topology, mesh, is_disrm=args.is_disrm, rows=rows, length=length,
                               max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                               decode_attention=args.decode_attention)
    budget, how = program_budget(topology)
    print(f"device budget per chip {budget / GiB:.1f} GiB: {how}")
    for report in reports:
        print(report.describe(budget))
    too_big = [r for r in reports if r.peak > budget]
    if too_big:
        r = too_big[0]
        print(f"error: {topology.label}: {r.name} does not fit: predicted {r.peak / GiB:.2f} GiB per chip, budget "
              f"{budget / GiB:.1f} GiB; reduce it with --compile-length / --batch-size, a mesh over "
              "more chips (--mesh fsdp=N,seq=M) or a larger topology", file=sys.stderr)
        return ExitStatus.DOES_NOT_FIT
    return ExitStatus.OK


if __name__ == "__main__":
    sys.exit(main())
