"""Long-RewardBench evaluation CLI: ``python -m longrm_jax.evaluate --model-path DIR --data-path DIR``.

Flags shared with upstream LongRM's ``evaluate/eval.py`` keep their meaning (``--model-path``,
``--data-path``, ``--is-disrm``, ``--save-path``); the rest are ours. See ``--help``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from longrm_jax.cli_support import (ExitStatus, add_debug_flag, cli_parser, configure_logging,
                                    debug_requested, run_cli, silence_absl_warnings)
from longrm_jax.compile_cache import enable_compilation_cache
from longrm_jax.evaluation.config import EvalConfig, check_paths
from longrm_jax.parallel.topology import program_budget
from longrm_jax.xla_flags import add_gpu_xla_flags

# The evaluator's heavy modules (the runner, models, HF loading: transformers and jax programs) are imported inside
# the functions that use them, so that `--help` and a refused flag answer without loading them.

log = logging.getLogger("longrm_jax.evaluate")
DESCRIPTION = ("Evaluate a generative (default) or discriminative (--is-disrm) reward model on Long-RewardBench task "
               "files ({Task}.jsonl) or Long-form RewardBench records. Writes results.csv (upstream layout), "
               "results.json (+AUC, both-orders agreement), predictions.jsonl and accuracy_by_length.png under "
               "--save-path.")


def build_parser():
    """The CLI's flags: one per ``EvalConfig`` setting (``schema_flags``), ``--config`` / ``--set``, ``--debug``."""
    from longrm_jax.schema_flags import add_schema_flags

    parser = cli_parser("longrm_jax.evaluate", DESCRIPTION, examples=[
        "python -m longrm_jax.evaluate --model-path runs/tiny_grm_hf --data-path data/tiny_judge/long_rewardbench "
        "--both-orders",
        "python -m longrm_jax.evaluate --model-path runs/tiny_disrm_hf --data-path data/lrb --is-disrm "
        "--set mesh={fsdp: 2, seq: 4}",
        "python -m longrm_jax.evaluate --model-path qwen3_8b --compile-only --topology h100x8 --compile-length 131072"],
        show_defaults=True)
    add_schema_flags(parser, EvalConfig)
    add_debug_flag(parser)
    return parser


def read_config(argv: Sequence[str]) -> EvalConfig:
    """The run's validated settings from the command line (``--config``, then ``--set``, then the flags)."""
    from longrm_jax.schema_flags import config_from_args

    return config_from_args(build_parser().parse_args(argv), EvalConfig)


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_evaluate, argv)


def _evaluate(argv: Sequence[str]) -> int:
    cfg = read_config(argv)
    # Ours at INFO; jax's backend probing only from WARNING up; tokamax's per-shape autotuning-cache misses (absl)
    # not at all, as in train.
    configure_logging()
    silence_absl_warnings()
    if cfg.compile_only:
        return _compile_only(cfg)
    check_paths(cfg)
    from longrm_jax.ops import slow_paths

    slow_paths.set_strict(cfg.strict_kernels)
    apply_gpu_decode_flags(cfg)  # before anything below touches a device
    enable_compilation_cache(cfg.compilation_cache)
    from longrm_jax.evaluation.outputs import format_summary, truncation_line
    from longrm_jax.evaluation.runner import USER_ERRORS, run_evaluation

    cfg.progress = cfg.progress and sys.stderr.isatty()
    try:
        summary = run_evaluation(cfg)
    except USER_ERRORS as error:  # bad data / model dir: one clear line, no traceback
        if debug_requested(argv):
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
    return NO_VERDICT_EXIT if not cfg.allow_no_verdicts and no_verdict_parsed(summary) else 0


def _gpu_backend_possible(environ) -> bool:
    """Whether JAX could start a GPU backend in this process, decided without starting any backend."""
    platforms = environ.get("JAX_PLATFORMS", "").lower()
    if platforms and not any(name in platforms for name in ("cuda", "gpu", "rocm")):
        return False
    import importlib.metadata  # these three: only when JAX_PLATFORMS leaves a GPU possible
    import importlib.util
    import pkgutil

    names = [entry.name for entry in importlib.metadata.entry_points(group="jax_plugins")]
    if importlib.util.find_spec("jax_plugins") is not None:
        import jax_plugins  # a namespace package that exists only where a plugin is installed

        names += [module.name for module in pkgutil.iter_modules(jax_plugins.__path__)]
    return any("cuda" in name or "rocm" in name for name in names)


def apply_gpu_decode_flags(cfg: EvalConfig, environ=None) -> bool:
    """Add the GPU decode XLA flags (``longrm_jax.xla_flags.GPU_DECODE_XLA_FLAGS``) for a GRM run; True if they
    were added.

    Must run before any JAX device use (XLA reads its flags when the backend starts). Skipped for DisRM
    scoring (measured slower prefill with them), with ``--no-gpu-flags``, without a GPU plugin or with
    ``JAX_PLATFORMS`` naming no GPU, and when a backend already runs (too late to take effect).
    """
    from jax._src import xla_bridge  # noqa: PLC0415 - private, but the only way to ask without starting one

    environ = os.environ if environ is None else environ
    if cfg.is_disrm or not cfg.gpu_flags or not _gpu_backend_possible(environ):
        return False
    if xla_bridge.backends_are_initialized():
        log.warning("JAX backend already started: GPU decode XLA flags not applied")
        return False
    add_gpu_xla_flags(environ=environ)
    log.info("GRM decode XLA flags: XLA_FLAGS=%s", environ["XLA_FLAGS"])
    return True


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


def _compile_model_config(cfg: EvalConfig):
    """(model config, dtype) for ``--compile-only``: the model directory's config, or a preset's with its own
    vocabulary."""
    head = "classifier" if cfg.is_disrm else "causal_lm"
    if os.path.isdir(cfg.model_path):
        from longrm_jax.hf.load import read_hf_config
        from longrm_jax.models.config import from_hf_config

        mcfg = from_hf_config(read_hf_config(cfg.model_path), head=head)
    else:
        from longrm_jax.models.config import ModelConfig
        from longrm_jax.training.model_setup import PRESETS

        if cfg.model_path not in PRESETS or "vocab_size" not in PRESETS[cfg.model_path]:
            raise ValueError(f"--model-path {cfg.model_path}: not a directory nor a preset with its own "
                             f"vocabulary ({', '.join(k for k, v in PRESETS.items() if 'vocab_size' in v)})")
        mcfg = ModelConfig(**PRESETS[cfg.model_path]).replace(head=head)
    dtype = cfg.dtype
    if dtype == "auto":  # as a run resolves it (runner.resolve_dtype); a preset has no stored dtype: bfloat16
        from longrm_jax.evaluation.runner import resolve_dtype

        dtype = (resolve_dtype(EvalConfig(model_path=cfg.model_path, data_path="", is_disrm=cfg.is_disrm))
                 if os.path.isdir(cfg.model_path) else "bfloat16")
    mcfg = mcfg.replace(dtype=dtype, param_dtype=dtype)
    return mcfg, dtype


def _compile_only(cfg: EvalConfig) -> int:
    """``--compile-only --topology NAME`` (evaluation.compile_only): 0 when every program fits, 4 otherwise."""
    from longrm_jax.parallel.topology import parse, prepare_host_for_compile_only

    topology = parse(cfg.topology, cfg.topology_slices)
    prepare_host_for_compile_only()
    if topology.platform == "gpu" and not cfg.is_disrm and cfg.gpu_flags:
        add_gpu_xla_flags()  # what a GRM run on a GPU sets
    from longrm_jax.evaluation.compile_only import compile_programs
    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.parallel.topology import GiB, host_count

    mcfg, dtype = _compile_model_config(cfg)
    devices = topology.devices()
    mesh = make_mesh(**(cfg.mesh or {"fsdp": -1}), devices=devices)
    length = cfg.compile_length or cfg.max_length
    rows = cfg.batch_size or 1
    print(f"topology {topology.label}: {topology.chips} x {topology.chip.device_kind} ({host_count(devices)} "
          f"host(s)), {topology.chip.hbm_bytes / GiB:.1f} GiB HBM per chip; compile only, nothing runs")
    print("mesh " + " x ".join(f"{k} {v}" for k, v in mesh.shape.items()) + f"; {'DisRM' if cfg.is_disrm else 'GRM'} "
          f"{mcfg.num_layers} layers, hidden {mcfg.hidden_size}, {dtype}; {rows} row(s) x {length} tokens")
    reports = compile_programs(mcfg, topology, mesh, is_disrm=cfg.is_disrm, rows=rows, length=length,
                               max_new_tokens=cfg.judgement_budget,
                               decode_attention=cfg.decode_attention)
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
