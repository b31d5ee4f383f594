"""Train a long-context reward model: ``python -m longrm_jax.train --config configs/NAME.yaml [--set k=v ...]``.

Stages: ``sft`` and ``simpo`` (generative RM: response log-probs), ``bt`` (Bradley-Terry, discriminative RM with
a score head). With no arguments it runs the embedded default (configs/tiny_default.yaml): a tiny
Qwen3-architecture generative reward model, randomly initialised, trained with SimPO on synthetic needle-in-a-
haystack pairs on the CPU, then evaluated on held-out pairs (pairwise accuracy before and after is printed).
See configs/ for the upstream recipes.
"""

from __future__ import annotations

import argparse
import os
import sys

import yaml

# The embedded default run (also in configs/tiny_bt.yaml). Tuned to finish in a few minutes on 2 CPU cores.
DEFAULT_CONFIG = yaml.safe_load("""
# SimPO with an NLL term on the chosen response (CPO-style). On these pairs chosen and rejected share every token
# but the password, so at random init a Bradley-Terry score read at the last token barely differs between them
# (gradients ~1e-7) and BT needs many more steps; SimPO's log-probs put the signal on the password token itself.
stage: simpo
seed: 0
output_dir: runs/default
steps: 200
log_every: 10
model:
  preset: tiny_qwen3
  compute_dtype: float32
  param_dtype: float32
data:
  source: synthetic
  seq_len: 256
  batch_rows: 16
  num_rejects: 1
  num_train: 4096
  num_eval: 128
  synthetic:
    lengths: [16, 32]     # haystack tokens around the needle (a tiny model's "long" context)
    num_values: 8         # passwords drawn from 8 values
loss:
  beta: 10.0
  gamma: 1.0
  nll_weight: 1.0
optim:
  lr: 3.0e-3
  warmup_ratio: 0.05
checkpoint:
  every: 50
  keep: 2
  overwrite: true         # running the demo again replaces its checkpoints
mesh:
  data: 1
  fsdp: 1
""")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m longrm_jax.train",
        description=__doc__.split("\n\n")[0] + " Without --config the embedded tiny CPU default runs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  python -m longrm_jax.train\n"
               "  python -m longrm_jax.train --config configs/tiny_simpo.yaml --set steps=50 --set optim.lr=1e-3\n"
               "  python -m longrm_jax.train --config configs/llama31_8b_disrm_bt.yaml --set lora.rank=0 --resume\n",
    )
    p.add_argument("--config", help="YAML run config (default: the embedded tiny CPU run)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted, e.g. optim.lr=1e-5, mesh.seq=2); repeatable")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in checkpoint.dir")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    from longrm_jax.cli_support import add_debug_flag

    add_debug_flag(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from longrm_jax.cli_support import run_cli

    return run_cli(_train, argv)


def _train(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from longrm_jax.training.config import ConfigError, load_config, to_yaml

    try:
        cfg = load_config(args.config, args.overrides, base=None if args.config else DEFAULT_CONFIG)
    except (ConfigError, FileNotFoundError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(to_yaml(cfg))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.model.remat in ("save_attention_out", "auto"):
        # Before the first device use: without it XLA re-runs the saved attention kernel on GPUs
        # (docs/perf_training.md). CPU runs ignore GPU flags.
        from longrm_jax.xla_flags import GPU_TRAIN_XLA_FLAGS, add_gpu_xla_flags

        add_gpu_xla_flags(GPU_TRAIN_XLA_FLAGS)
    from longrm_jax.training.loop import DegenerateDataError, NonFiniteLossError, run
    from longrm_jax.training.run_lock import RunDirLockedError

    try:
        result = run(cfg, resume=args.resume)
    except (NonFiniteLossError, DegenerateDataError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 3
    except (FileExistsError, FileNotFoundError, RunDirLockedError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result.accuracy_before is not None or result.accuracy_after is not None:
        fmt = lambda a: "n/a" if a is None else f"{100 * a:.1f}%"  # noqa: E731
        print(f"pairwise accuracy on held-out pairs: before {fmt(result.accuracy_before)}, "
              f"after {fmt(result.accuracy_after)} ({result.final_step} steps)")
    elif result.no_eval_reason:
        print(f"pairwise accuracy on held-out pairs: not measured ({result.no_eval_reason})")
    if result.degenerate_groups:
        print(f"WARNING: {result.degenerate_groups} of {result.trained_groups} preference groups trained gave no "
              "gradient (chosen identical to rejected after truncation; see the log above)")
    print(f"checkpoints: {result.checkpoint_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
