"""Benchmark the data pipeline: tokenizing + packing synthetic 32K-token samples, tokens per second.

    python scripts/bench_data.py [--tokenizer DIR] [--context-tokens 32768] [--pairs 32] [--no-record]

Measures (on this machine's CPU cores, wall clock):
- tokenize: chat templating + tokenization + masks of preference pairs (chosen + rejected),
- pack: fitting, packing and batching the tokenized groups into 131,072-token rows,
- pipeline: the grain training iterator end to end (threads as `--threads`), from records to batches.
Prints a table and appends a dated section to docs/benchmarks.md (``--no-record``: print only).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import _bench
from longrm_jax.data import synthetic
from longrm_jax.data.packing import make_buckets, pack_batches
from longrm_jax.data.pipeline import make_train_iterator
from longrm_jax.data.records import PreferenceRecord, Provenance
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
from longrm_jax.data.tokenize import ChatTokenizer


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Tokenizing + packing throughput on synthetic 32K-token samples.")
    p.add_argument("--tokenizer", default=TINY_TOKENIZER_DIR, help="tokenizer directory (default: tiny)")
    p.add_argument("--context-tokens", type=int, default=32_600, help="context tokens per sample (~32K-token samples; two pairs fill a 131,072 row)")
    p.add_argument("--pairs", type=int, default=32)
    p.add_argument("--max-length", type=int, default=131_072)
    p.add_argument("--threads", type=int, default=2)
    _bench.add_common_flags(p, iters=None, warmup=None, smoke_help="4 pairs of 2,000-token contexts")
    args = p.parse_args(argv)
    if args.smoke:
        args.pairs, args.context_tokens, args.max_length = 4, 2_000, 8_192

    tok = ChatTokenizer.from_dir(args.tokenizer)
    count = lambda text: len(tok.encode(text))  # noqa: E731
    t0 = time.perf_counter()
    rows = synthetic.training_rows(args.pairs, 0, [args.context_tokens], count_tokens=count)
    t_gen = time.perf_counter() - t0
    records = [PreferenceRecord(tuple(r["chat_template"]), r["chosen"], tuple(r["rejects"]),
                                Provenance("synthetic", i)) for i, r in enumerate(rows)]

    t0 = time.perf_counter()
    groups = [tok.tokenize(r, 1) for r in records]
    t_tok = time.perf_counter() - t0
    n_tokens = sum(g.num_tokens for g in groups)

    t0 = time.perf_counter()
    batches = pack_batches(groups, make_buckets(args.max_length), 1, 2, tok.pad_id, tok.eos_id)
    t_pack = time.perf_counter() - t0

    it = make_train_iterator(records, tok, stage="simpo", max_length=args.max_length, batch_size=1,
                             num_epochs=1, window_groups=16, worker_count=args.threads, process_index=0,
                             process_count=1)
    t0 = time.perf_counter()
    n_pipe = sum(int((b["segment_ids"] > 0).sum()) for b in it)
    t_pipe = time.perf_counter() - t0
    it.close()

    cores = os.cpu_count()
    results = [("tokenize", n_tokens, t_tok), ("pack", n_tokens, t_pack), ("pipeline", n_pipe, t_pipe)]
    print(f"{args.pairs} pairs of ~{args.context_tokens}-token contexts ({n_tokens} tokens, generated in "
          f"{t_gen:.1f}s), {len(batches)} rows of {args.max_length}, {cores} CPU cores, "
          f"tokenizer {os.path.basename(os.path.normpath(args.tokenizer))}")
    print(f"{'stage':<10} {'tokens':>10} {'seconds':>8} {'tokens/s':>12}")
    for name, n, t in results:
        print(f"{name:<10} {n:>10} {t:>8.2f} {n / t:>12,.0f}")

    path = _bench.record_path(args)
    if path:
        tokenizer = os.path.basename(os.path.normpath(args.tokenizer))
        _bench.append_section(
            path, "data pipeline", command=_bench.command_line(argv),
            device=f"{cores} CPU cores ({platform.processor() or platform.machine()})",
            details=f"{args.pairs} synthetic preference pairs, contexts of ~{args.context_tokens} tokens, tokenizer "
                    f"`{tokenizer}`, rows of {args.max_length}",
            table=_bench.markdown_table(("stage", "tokens", "seconds", "tokens/s"),
                                        [(name, n, f"{t:.2f}", f"{n / t:,.0f}") for name, n, t in results], "lrrr"))

if __name__ == "__main__":
    main()
