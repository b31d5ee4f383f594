"""Export a checkpoint as a Hugging Face directory.

    python -m longrm_jax.export --checkpoint SRC --out DIR [--dtype bfloat16] [--max-shard-size 5GB]

SRC is a local HF checkpoint directory or a training run's orbax checkpoint directory (the run's
``output_dir`` or its ``checkpoints/``; LoRA adapters are merged into the weights). ``resolve_checkpoint`` is
the single place that turns SRC into a model: the library below knows nothing of this command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from typing import Any

from longrm_jax.cli_support import InputError, add_debug_flag, cli_parser, run_cli, silence_absl_warnings
from longrm_jax.config_rules import check_flat, choice

# HF loading and saving, the models and orbax are imported inside the functions that use them, so that `--help` and
# a refused flag answer without loading them.


@dataclasses.dataclass
class ExportConfig:
    """A checkpoint written as a Hugging Face directory. Read from ``--config FILE``, ``--set KEY=VALUE`` and one
    flag per key (``longrm_jax.schema_flags``), as every CLI's settings are."""

    # Source: a local Hugging Face checkpoint directory, or a training run's orbax checkpoint directory (its
    # output_dir, its checkpoints/ or one step folder in it).
    checkpoint: str | None = None
    out: str | None = None  # Output directory: new or empty (else overwrite); never inside the source.
    # Replace a non-empty out directory (the new export is written aside and swapped in whole).
    overwrite: bool = False
    dtype: str | None = choice(None, ("float32", "bfloat16", "float16"))  # Stored weight dtype (null: unchanged).
    max_shard_size: str = "5GB"  # Largest safetensors shard (e.g. 5GB, 500MB, or bytes).
    # Head kind to load a Hugging Face source as (null: from its architecture); a training checkpoint is
    # exported with the head it was trained with, and any other head is refused.
    head: str | None = choice(None, ("causal_lm", "classifier"))
    tokenizer_dir: str | None = None  # Copy tokenizer files from here (null: from the source).

    def validate(self) -> ExportConfig:
        check_flat(self, {"checkpoint": "SRC, the checkpoint to export", "out": "DIR, the output directory"})
        return self


@dataclasses.dataclass
class ResolvedCheckpoint:
    """A loaded model plus what the export should carry over from its source."""

    model: Any
    hf_config: dict | None = None  # source config.json (keys we do not model are kept)
    generation_config: dict | None = None
    tokenizer_dir: str | None = None


def resolve_checkpoint(src: str, *, head: str | None = None) -> ResolvedCheckpoint:
    """Load SRC: a training checkpoint of this package (LoRA merged), else a local HF directory."""
    resolved = _training_checkpoint(src)
    if resolved is not None:
        return resolved
    from longrm_jax.hf.load import load_pretrained, read_hf_config

    if not os.path.isdir(src):
        from longrm_jax.training.checkpoint import completed_steps

        parent = os.path.dirname(os.path.normpath(src))
        steps = completed_steps(parent) if os.path.basename(os.path.normpath(src)).isdigit() else []
        there = f"; {parent} holds steps {', '.join(map(str, steps))}" if steps else ""
        raise FileNotFoundError(f"--checkpoint {src}: not a directory (expected a Hugging Face checkpoint directory, "
                                f"a training run directory, its checkpoints/ or one step folder in it){there}")
    gen_path = os.path.join(src, "generation_config.json")
    generation = None
    if os.path.isfile(gen_path):
        with open(gen_path) as fh:
            generation = json.load(fh)
    return ResolvedCheckpoint(
        model=load_pretrained(src, head=head),
        hf_config=read_hf_config(src),
        generation_config=generation,
        tokenizer_dir=src,
    )


def _training_checkpoint(src: str) -> ResolvedCheckpoint | None:
    """A training checkpoint directory (the run's ``output_dir``, its ``checkpoints/`` or one step folder) with
    LoRA merged; None for anything else. Tokenizer files come from the run's ``data.tokenizer`` (the bundled
    tiny tokenizer when unset)."""
    # Imported here: orbax and the training stack are only needed when SRC is a training checkpoint.
    from longrm_jax.training.checkpoint import locate_training_checkpoint, saved_run_config

    located = locate_training_checkpoint(src)
    if located is None:
        return None
    from longrm_jax.training.model_setup import trained_model

    directory, step = located
    run_cfg, step = saved_run_config(directory, step)
    tokenizer_dir = run_cfg.get("data", {}).get("tokenizer")
    if tokenizer_dir is None:
        from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR

        tokenizer_dir = TINY_TOKENIZER_DIR
    return ResolvedCheckpoint(model=trained_model(directory, step), tokenizer_dir=tokenizer_dir)


def _head_of(model) -> str:
    from longrm_jax.models import SequenceClassifier

    return "classifier" if isinstance(model, SequenceClassifier) else "causal_lm"


def _inside(path: str, parent: str) -> bool:
    path, parent = os.path.realpath(path), os.path.realpath(parent)
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def check_out_dir(out: str, src: str, *, overwrite: bool) -> None:
    """Refuse an ``--out`` that would destroy the source or someone else's files (before anything is loaded)."""
    if _inside(out, src) or (os.path.exists(src) and _inside(src, out)):
        raise InputError(f"--out {out} overlaps --checkpoint {src}: writing there could destroy the source; "
                         "choose a directory outside it")
    if os.path.isfile(out):
        raise InputError(f"--out {out} is a file, not a directory")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise InputError(f"--out {out} is not empty; pass --overwrite to replace its contents, or choose a new "
                         "directory")


def check_tokenizer_dir(path: str) -> None:
    """``--tokenizer-dir`` must hold tokenizer files: an export without them cannot be evaluated or served."""
    from longrm_jax.hf.save import TOKENIZER_FILES

    if not os.path.isdir(path):
        raise InputError(f"--tokenizer-dir {path}: not a directory")
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        raise InputError(f"--tokenizer-dir {path}: no tokenizer files (expected some of "
                         f"{', '.join(TOKENIZER_FILES[:3])}, ...)")


def build_parser() -> argparse.ArgumentParser:
    from longrm_jax.schema_flags import add_schema_flags

    parser = cli_parser("longrm_jax.export", "Write a checkpoint as a Hugging Face directory (sharded safetensors + "
                        "index, config.json with 4.x and 5.x RoPE keys, generation config, tokenizer files) that "
                        "transformers 4.45-5.x loads.", show_defaults=True)
    add_schema_flags(parser, ExportConfig)
    add_debug_flag(parser)
    return parser


def _export(argv: list[str]) -> int:
    from longrm_jax.schema_flags import config_from_args

    args = config_from_args(build_parser().parse_args(argv), ExportConfig)  # a refusal: run_cli's one line, exit 2
    silence_absl_warnings()
    check_out_dir(args.out, args.checkpoint, overwrite=args.overwrite)
    from longrm_jax.hf.save import parse_size, save_pretrained

    parse_size(args.max_shard_size)  # a bad size stops here, before anything is loaded
    if args.tokenizer_dir is not None:
        check_tokenizer_dir(args.tokenizer_dir)

    resolved = resolve_checkpoint(args.checkpoint, head=args.head)
    if args.head is not None and _head_of(resolved.model) != args.head:
        raise InputError(f"--head {args.head}: {args.checkpoint} holds a {_head_of(resolved.model)} model (the head "
                         f"it was trained with); exporting it as {args.head} would need a head it never trained. "
                         "Drop --head, or train that stage")
    parent = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(args.out))}.export-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would carry over to --out
    try:
        files = save_pretrained(
            resolved.model,
            staging,
            dtype=args.dtype,
            tokenizer_dir=args.tokenizer_dir or resolved.tokenizer_dir,
            max_shard_bytes=args.max_shard_size,
            base_config=resolved.hf_config,
            generation_config=resolved.generation_config,
            progress=sys.stderr.isatty(),  # a bar redrawn into a log file is one long line
        )
        _swap_in(staging, args.out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(f"wrote {len(files)} files to {args.out}: {', '.join(files)}")
    from longrm_jax.hf.save import TOKENIZER_FILES

    if not set(files) & set(TOKENIZER_FILES):
        print(f"warning: {args.out} holds no tokenizer ({resolved.tokenizer_dir} has no tokenizer files): evaluate "
              "and transformers need one; export again with --tokenizer-dir DIR", file=sys.stderr)
    return 0


def _swap_in(staging: str, out: str) -> None:
    """Replace ``out`` by the complete ``staging`` directory: a crash leaves either the old or the new export."""
    old = None
    if os.path.exists(out):
        old = f"{staging}.old"
        os.rename(out, old)
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_export, argv)


if __name__ == "__main__":
    sys.exit(main())
