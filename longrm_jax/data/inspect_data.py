"""Inspect a dataset as the trainer will see it.

    python -m longrm_jax.data.inspect_data --data PATH --tokenizer DIR [--format auto] [--split S]
        [--max-length N] [--num-rejects R] [--sample I] [--limit N] [--skip-bad-rows]

Prints: row counts (and skipped bad rows), a text histogram of sequence lengths (tokens), what the training
rules would do at `--max-length` (samples whose prompt is cut in its middle, responses cut, pairs given a row of
their own, identical pairs dropped) and the packing they produce (rows per bucket, fill), and one sample
rendered with its loss mask: untrained (prompt) text in [[double brackets]], trained text plain.
Long-RewardBench and Long-form files are shown as preference groups (first/best candidate as chosen).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tqdm import tqdm

from longrm_jax.cli_support import ExitStatus, add_debug_flag, cli_parser, debug_requested, run_cli
from longrm_jax.config_rules import check_flat, choice, ranged
from longrm_jax.data.packing import bucket_for, make_buckets, own_row_length, plan_rows
from longrm_jax.data.readers import FORMATS, RecordSource
from longrm_jax.data.records import BenchRecord, DataError, LongFormRecord
from longrm_jax.data.tokenize import RESPONSE_ENDS, ChatTokenizer, TruncationStats


def _as_training_record(rec):
    return rec.to_preference() if isinstance(rec, (BenchRecord, LongFormRecord)) else rec


def length_histogram(lengths: Sequence[int], width: int = 40) -> str:
    """Text histogram over power-of-two bins."""
    if not lengths:
        return "(no samples)"
    bins = Counter(int(np.ceil(np.log2(max(n, 1)))) for n in lengths)
    top = max(bins.values())
    lines = []
    for e in range(min(bins), max(bins) + 1):
        lo, hi = (2 ** (e - 1) + 1 if e > 0 else 0), 2 ** e
        count = bins.get(e, 0)
        lines.append(f"  {lo:>8}-{hi:<8} {count:>7}  {'#' * max(int(width * count / top), 1 if count else 0)}")
    arr = np.asarray(lengths)
    lines.append(f"  min {arr.min()}  median {int(np.median(arr))}  mean {arr.mean():.0f}  max {arr.max()}  "
                 f"total {arr.sum()}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_inspect, argv)


@dataclass
class InspectConfig:
    """What to inspect and how the trainer would read it."""

    data: str | None = None  # a .jsonl/.json/.parquet file or a save_to_disk directory
    # Local model or tokenizer directory (HF tokenizer + chat template), e.g. the bundled
    # longrm_jax/assets/tiny_tokenizer.
    tokenizer: str | None = None
    format: str = choice("auto", FORMATS)  # row format (auto: told from the first rows' fields)
    split: str | None = None  # split of a DatasetDict directory
    max_length: int | None = ranged(None, ">= 1")  # largest row length in tokens (as in training)
    num_buckets: int = ranged(4, ">= 1")  # row-length buckets below --max-length (the trainer's data.num_buckets)
    num_rejects: int = ranged(1, ">= 1")  # rejected responses kept per preference row (as data.num_rejects)
    sample: int = ranged(0, ">= 0")  # index of the sample to render
    render_chars: int = ranged(3000, ">= 1")  # characters of the rendered sample to show
    limit: int | None = ranged(None, ">= 1")  # inspect only the first N rows
    skip_bad_rows: bool = False  # log and count bad rows instead of stopping at the first
    # Chat template variable: unset (as upstream training: Qwen3's empty think block opens the trained response),
    # false (the block ends the masked prompt) or true.
    enable_thinking: str = choice("unset", ("unset", "false", "true"))
    # Per-sequence cut at --max-length, as data.truncation in training.
    truncation: str = choice("prompt_middle", ("prompt_middle", "right", "error"))
    # Jinja chat template file to use instead of the tokenizer's (or where it has none).
    chat_template: str | None = None
    # How a response ends, as data.response_end in training (template: as the chat template ends the turn, where
    # the evaluator reads a DisRM's score).
    response_end: str = choice("upstream", RESPONSE_ENDS)

    METAVARS: ClassVar[dict[str, str]] = {"data": "PATH", "tokenizer": "DIR", "split": "NAME",
                                          "chat_template": "FILE"}

    def validate(self) -> "InspectConfig":
        check_flat(self, {"data": "PATH, a data file or directory", "tokenizer": "DIR, a tokenizer directory"})
        return self


def build_parser() -> argparse.ArgumentParser:
    from longrm_jax.schema_flags import add_schema_flags

    p = cli_parser("longrm_jax.data.inspect_data", "Inspect a dataset as the trainer will see it: counts, length "
                   "histogram, truncations, packing, one sample with its loss mask.", show_defaults=True)
    add_schema_flags(p, InspectConfig)
    add_debug_flag(p)
    return p


def _inspect(argv: Sequence[str]) -> int:
    from longrm_jax.schema_flags import config_from_args

    args = config_from_args(build_parser().parse_args(argv), InspectConfig)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        src = RecordSource(args.data, args.format, args.split, skip_bad_rows=args.skip_bad_rows)
        thinking = {"unset": None, "false": False, "true": True}[args.enable_thinking]
        tok = ChatTokenizer.from_dir(args.tokenizer, enable_thinking=thinking, chat_template=args.chat_template,
                                     response_end=args.response_end)
        n_rows = len(src) if args.limit is None else min(args.limit, len(src))
        groups, skipped = _tokenize_rows(src, tok, n_rows, args)
    except (DataError, FileNotFoundError, ValueError) as e:
        if debug_requested(argv):
            raise
        print(f"error: {e}", file=sys.stderr)
        return ExitStatus.INPUT_REFUSED

    sample_lengths = [len(s) for g in groups for s in g.samples]
    print(f"data: {src.source_name}  format: {src.format}  rows: {len(src)}  inspected: {n_rows}  "
          f"bad rows skipped: {skipped}")
    print(f"groups: {len(groups)}  samples: {len(sample_lengths)}  "
          f"trained tokens: {sum(int(s.loss_mask.sum()) for g in groups for s in g.samples)}")
    print("\nsequence length (tokens) histogram:")
    print(length_histogram(sample_lengths))
    if args.max_length:
        try:
            _print_packing(groups, sample_lengths, tok, args)
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return ExitStatus.INPUT_REFUSED
    if groups:
        _print_sample(groups, tok, args)
    return ExitStatus.OK


def _tokenize_rows(src, tok, n_rows: int, args) -> tuple[list, int]:
    """(tokenized groups of the first ``n_rows`` rows, bad rows skipped with --skip-bad-rows)."""
    groups, stats, skipped = [], TruncationStats(), 0
    for i in tqdm(range(n_rows), desc="tokenizing", unit="row", file=sys.stderr, disable=not sys.stderr.isatty()):
        try:
            rec = _as_training_record(src[i])
            num_rejects = min(args.num_rejects, len(getattr(rec, "rejected", ())) or 1)
            groups.append(tok.tokenize(rec, num_rejects, stats=stats))
        except DataError as e:
            if not args.skip_bad_rows:
                raise
            skipped += 1
            logging.warning("skipping bad row: %s", e)
    return groups, skipped


def _print_packing(groups: list, sample_lengths: list[int], tok, args) -> None:
    """The truncation rules and the packing into --max-length rows, as the trainer applies them."""
    buckets = make_buckets(args.max_length, args.num_buckets)
    capacity = max(buckets)
    if capacity != args.max_length:
        print(f"\nnote: rows of {capacity} tokens: --max-length {args.max_length} rounded up to a multiple of 128, "
              "as the trainer's row buckets are")
    over = sum(n > capacity for n in sample_lengths)
    rules = TruncationStats()
    rows, own = plan_rows(groups, capacity, len(groups[0].samples) if groups else 1, tok.eos_id,
                          args.truncation, rules)
    counts = rules.as_dict()
    print(f"\nrules at row length {capacity} (each sequence on its own, policy {args.truncation}): "
          f"{over} of {len(sample_lengths)} samples longer than the row")
    print(f"  prompt cut in its middle: {counts['prompt_cut_samples']}  response cut: "
          f"{counts['response_cut_samples']}  tokens dropped: {counts['dropped_tokens']}")
    print(f"  groups in a row of their own: {counts['own_row_groups']}  identical pairs dropped: "
          f"{counts['identical_pairs_dropped']}")
    per_bucket = Counter(bucket_for(r.used, buckets) for r in rows)
    used = sum(r.used for r in rows + own)
    own_len = own_row_length(capacity, len(groups[0].samples)) if groups else 0
    total_capacity = sum(bucket_for(r.used, buckets) for r in rows) + own_len * len(own)
    print(f"packing into buckets {buckets}: {len(rows)} shared rows "
          f"({', '.join(f'{b}: {per_bucket.get(b, 0)}' for b in buckets)}), {len(own)} own rows of {own_len}, "
          f"fill {used / max(total_capacity, 1):.1%}")


def _print_sample(groups: list, tok, args) -> None:
    """Sample --sample with its loss mask: [[...]] not trained, plain trained."""
    g = groups[min(args.sample, len(groups) - 1)]
    p_ = g.provenance
    print(f"\nsample {min(args.sample, len(groups) - 1)} ({p_.source} {p_.where()}), "
          f"{len(g.samples)} sequence(s); [[...]] = not trained (loss_mask 0), plain = trained:")
    for j, s in enumerate(g.samples):
        role = "sft" if len(g.samples) == 1 else ("chosen" if j == 0 else f"rejected {j}")
        print(f"\n--- {role}: {len(s)} tokens, {int(s.loss_mask.sum())} trained ---")
        print(tok.render_masked(s, max_chars=args.render_chars))


if __name__ == "__main__":
    sys.exit(main())
