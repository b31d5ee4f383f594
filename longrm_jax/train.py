"""Train a long-context reward model: ``python -m longrm_jax.train --config configs/NAME.yaml [--set k=v ...]``.

Stages: ``sft`` and ``simpo`` (generative RM: response log-probs), ``bt`` (Bradley-Terry, discriminative RM with
a score head). With no arguments it runs the default shipped with the package (longrm_jax/configs/tiny_default.yaml,
linked from configs/): a tiny Qwen3-architecture generative reward model, randomly initialised, trained with SimPO
on synthetic needle-in-a-haystack pairs on the CPU, then evaluated on held-out pairs (pairwise accuracy before and
after is printed).
See configs/ for the upstream recipes.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import resources

import yaml

from longrm_jax.cli_support import (ExitStatus, InputError, add_debug_flag, add_strict_kernels_flag, add_topology_flags,
                                    cli_parser, configure_logging, run_cli, silence_absl_warnings)
from longrm_jax.training.run_lock import RunDirLockedError
from longrm_jax.xla_flags import GPU_DECODE_XLA_FLAGS, GPU_MESH_XLA_FLAGS, GPU_TRAIN_XLA_FLAGS, add_gpu_xla_flags

# The training stack (jax, the model, data and loop) is imported inside the functions that run it, so that `--help`
# and a refused flag or config key answer without loading it (seconds of imports).

# The default run (no --config): package data, so an installed package has it too.
DEFAULT_CONFIG_FILE = "configs/tiny_default.yaml"
DEFAULT_CONFIG = yaml.safe_load(resources.files("longrm_jax").joinpath(DEFAULT_CONFIG_FILE).read_text())


def build_parser() -> argparse.ArgumentParser:
    examples = ["", "--config configs/tiny_bt.yaml --set steps=50 --set optim.lr=1e-3",
                "--config configs/tiny_simpo.yaml   # after configs/tiny_sft.yaml (its model.init)",
                "--config configs/llama31_8b_disrm_bt.yaml --set lora.rank=0 --resume"]
    p = cli_parser("longrm_jax.train", __doc__.split("\n\n")[0] + " Without --config the packaged tiny CPU default runs.",
                   examples=[f"python -m longrm_jax.train {example}".rstrip() for example in examples])
    p.add_argument("--config", help="YAML run config (default: the tiny CPU run shipped with the package)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted, e.g. optim.lr=1e-5, mesh.seq=2); repeatable")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in checkpoint.dir")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    add_strict_kernels_flag(p, "a broken tokamax import, a cuDNN too old for the packed backward, ...; same as "
                               "--set strict_kernels=true")
    add_topology_flags(p, "the train step", "a TPU slice (v5p-64, v6e-16, v5e-8, v4-32) or GPU hosts (h100x8, "
                                            "h200x4, h100x8x2 = 2 hosts x 8)")
    p.add_argument("--assume-mfu", type=float, default=0.4, metavar="F",
                   help="with --compile-only: the MFU at which the step time is stated (default 0.4)")
    add_debug_flag(p)
    return p


def _allow_pinned_host_memory(cfg) -> None:
    """Offloading policies keep activations in pinned host memory, which XLA's GPU client caps at 64 GB unless
    told otherwise before it starts (a 2 x 128K Qwen3-8B pair offloads 72 GiB): raise the cap to the memory
    plan's host budget (``host_memory_budget_gib`` per device, else 75% of the RAM) unless the user set it."""
    from longrm_jax.training.memory_budget import HOST_RAM_SHARE, host_ram_bytes

    if "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB" in os.environ:
        return
    ram = host_ram_bytes()
    budget = cfg.host_memory_budget_gib or (HOST_RAM_SHARE * ram / 2**30 if ram else None)
    if budget:
        os.environ["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"] = str(int(budget))


def main(argv: list[str] | None = None) -> int:
    return run_cli(_train, argv)


def _train(argv: list[str]) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest:
        argv = list(sys.argv[1:] if argv is None else argv)
        at = argv.index(rest[0]) if rest[0] in argv else -1
        meant = (at >= 2 and argv[at - 2] == "--set" and "=" not in argv[at - 1] and not rest[0].startswith("-"))
        parser.error(f"unrecognized arguments: {' '.join(rest)}"
                     + (f" (each --set takes one KEY=VALUE: --set {argv[at - 1]}={rest[0]})" if meant else ""))
    from longrm_jax.training.config import ConfigError, load_config, to_yaml

    try:
        cfg = load_config(args.config, args.overrides, base=None if args.config else DEFAULT_CONFIG)
    except (ConfigError, FileNotFoundError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return ExitStatus.INPUT_REFUSED
    if args.print_config:
        print(to_yaml(cfg))
        return ExitStatus.OK
    from longrm_jax.ops import slow_paths

    slow_paths.set_strict(cfg.strict_kernels or args.strict_kernels)
    configure_logging()
    if args.compile_only or args.topology:
        return _compile_only(cfg, args)
    _prepare_process(cfg)
    import jax

    from longrm_jax.data.pipeline import NoTrainableDataError
    from longrm_jax.training.interrupt import TrainingInterrupted
    from longrm_jax.training.loop import DegenerateDataError, NonFiniteLossError, run
    from longrm_jax.training.run_dir import ResumeMismatchError

    try:
        judge = None
        if cfg.judge.data is not None:  # the evaluator's stack loads only for a run that judges
            from longrm_jax.held_out_judge import make_judge

            judge = make_judge(cfg)
        result = run(cfg, resume=args.resume, judge=judge)
    except TrainingInterrupted as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    except (NonFiniteLossError, DegenerateDataError, NoTrainableDataError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return ExitStatus.TRAINING_STOPPED
    except (FileExistsError, FileNotFoundError, RunDirLockedError, ResumeMismatchError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return ExitStatus.INPUT_REFUSED
    if jax.process_index() == 0:  # every process holds the same result; one prints it
        _print_result(result, slow_paths.summary_line())
    return ExitStatus.OK


def _prepare_process(cfg) -> None:
    """What the process sets before its first device use: quiet tokenizers and absl, the GPU XLA flags the run's
    mesh and remat policy need, pinned host memory for offloading, the persistent compilation cache."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # orbax's routine absl warnings (e.g. "Given directory is read only" restoring model.init from another run's
    # checkpoint) are noise to a user; errors still show, and our own logging is untouched
    silence_absl_warnings()
    add_gpu_xla_flags(GPU_MESH_XLA_FLAGS)  # collectives in the layer loops pipelined: multi-GPU meshes only use them
    if cfg.model.remat in ("save_attention_out", "auto") or cfg.model.remat.startswith("offload_"):
        # Without it XLA re-runs the saved attention kernel on GPUs (docs/perf_training.md), or writes a clone of
        # it straight into the offloaded stack. CPU runs ignore GPU flags.
        add_gpu_xla_flags(GPU_TRAIN_XLA_FLAGS)
    if cfg.judge.data is not None:
        # Held-out judging decodes in this process as `evaluate` decodes in its own: with its GPU flags (those not
        # set above), so that greedy tokens, which follow the GEMM kernels' rounding, are the same.
        add_gpu_xla_flags(GPU_DECODE_XLA_FLAGS)
    if cfg.model.remat == "auto" or cfg.model.remat.startswith("offload_"):
        _allow_pinned_host_memory(cfg)
    if cfg.compilation_cache:
        import jax

        # Programs that compile in under JAX's threshold (1 s by default) are not stored; the environment variable
        # JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS changes it (the tests store everything with 0).
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(cfg.compilation_cache))


def _print_result(result, slow_line: str | None) -> None:
    """The run's closing lines: held-out verdicts (a judge's), held-out accuracy (or why none), degenerate groups,
    the summary, checkpoints."""
    from longrm_jax.training.step_loop import judge_line

    if result.judged:
        step = max(result.judged)
        print(f"judge at step {step}: {judge_line(result.judged[step])}")
    what = "judgement log-prob accuracy" if result.judged else "pairwise accuracy"
    if result.accuracy_before is not None or result.accuracy_after is not None:
        print(f"{what} on held-out pairs: before {_percent(result.accuracy_before)}, "
              f"after {_percent(result.accuracy_after)} ({result.final_step} steps)")
    elif result.no_eval_reason:
        print(f"pairwise accuracy on held-out pairs: not measured ({result.no_eval_reason})")
    if result.degenerate_groups:
        print(f"WARNING: {result.degenerate_groups} of {result.trained_groups} preference groups trained gave no "
              "gradient (chosen identical to rejected after truncation; see the log above)")
    print(run_summary(result))
    print(f"checkpoints: {result.checkpoint_dir}")
    if slow_line:
        print(slow_line)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def run_summary(result) -> str:
    """The end-of-run summary: steps, final loss, held-out accuracy, wall time, tokens/s, saved steps."""
    steps = f"{result.final_step} steps" + (f" ({result.final_step - result.start_step} in this run, resumed at "
                                            f"{result.start_step})" if result.start_step else "")
    loss = result.last_metrics.get("loss")
    accuracy = ("not measured" if result.accuracy_before is None and result.accuracy_after is None
                else f"{_percent(result.accuracy_before)} -> {_percent(result.accuracy_after)}")
    if result.judged:
        accuracy = (f"{_percent(result.judged[max(result.judged)]['verdict_accuracy'])} (verdicts over both orders; "
                    f"judgement log-probs {accuracy})")
    speed = (f"{result.tokens_per_s:,.0f} tokens/s (steps after the first, which compiles)"
             if result.tokens_per_s else f"{result.tokens:,} tokens")
    saved = ", ".join(map(str, result.saved_steps)) or "none"
    return (f"summary: {steps}, final loss {'n/a' if loss is None else f'{loss:.4f}'}, held-out accuracy "
            f"{accuracy}, wall time {result.wall_s:.1f} s, {speed}; checkpoint steps {saved}")


def _compile_only(cfg, args) -> int:
    """``--compile-only --topology NAME`` (training.compile_only): 0 when the step fits, 4 when it does not."""
    if not (args.compile_only and args.topology):
        raise InputError("--compile-only and --topology go together (e.g. --compile-only --topology v5p-64)")
    if not 0 < args.assume_mfu <= 1:
        raise InputError(f"--assume-mfu must be in (0, 1], got {args.assume_mfu}")
    from longrm_jax.parallel.topology import parse, prepare_host_for_compile_only

    topology = parse(args.topology, args.topology_slices)
    prepare_host_for_compile_only()
    if topology.platform == "gpu":  # the flags a GPU run sets (see _train)
        add_gpu_xla_flags(GPU_MESH_XLA_FLAGS)
        if cfg.model.remat in ("save_attention_out", "auto") or cfg.model.remat.startswith("offload_"):
            add_gpu_xla_flags(GPU_TRAIN_XLA_FLAGS)
    from longrm_jax.training.compile_only import compile_train_step

    silence_absl_warnings()  # tokamax logs an autotuning-cache miss per kernel shape through absl
    report = compile_train_step(cfg, topology, mfu=args.assume_mfu)
    print("\n".join(report.lines))
    if not report.fits:
        # The plan's whole message is in the report above; the error line names the verdict only.
        first = report.error.splitlines()[0].rstrip(":") if report.error else "the step does not fit"
        print(f"error: {topology.label}: {first} (the memory plan's figures and what reduces them: above)",
              file=sys.stderr)
        return ExitStatus.DOES_NOT_FIT
    return ExitStatus.OK


if __name__ == "__main__":
    sys.exit(main())
