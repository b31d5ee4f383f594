"""Length buckets and batch plans: a few static shapes, so each jitted function compiles a handful of times.

Sequences are sorted by length (longest first, so the first compile and any out-of-memory error show up at
once), assigned to the smallest bucket that holds them and grouped into batches of a fixed row count per
bucket. Short final batches are filled with dummy rows so that every call of a bucket has the same shape.

Two ways to choose the buckets: a fixed ladder (:func:`bucket_lengths`, 2^k and 1.5 * 2^k: up to a third of
a bucket is padding) when lengths arrive over time, and :func:`fit_buckets` when the whole run's lengths are
known up front: sizes fitted to those lengths that trade padding against compiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence

import numpy as np

from longrm_jax.data.packing import bucket_for
from longrm_jax.ops.contract import round_up

MIN_BUCKET = 128


def bucket_lengths(max_length: int, multiple: int = 1, min_bucket: int = MIN_BUCKET) -> list[int]:
    """Bucket sizes up to ``max_length``: 2^k and 1.5 * 2^k (at most a third of a batch is padding), each
    rounded up to ``multiple`` (e.g. the seq mesh axis or the prefill chunk)."""
    sizes, base = set(), min_bucket
    while True:
        for size in (base, base * 3 // 2):
            sizes.add(int(round_up(size, multiple)))
        if base >= max_length:
            break
        base *= 2
    return sorted(sizes)


def fit_buckets(
    lengths: Sequence[int],
    cost: Callable[[int], float],
    *,
    new_bucket_cost: float,
    multiple: int = MIN_BUCKET,
    ready: Collection[int] = (),
) -> list[int]:
    """Bucket sizes for a run whose ``lengths`` are all known: the set that minimises the run's cost.

    Every length is padded to a bucket; an item in bucket ``b`` costs ``cost(b)`` (e.g. the forward FLOPs of
    ``b`` tokens), and each bucket not in ``ready`` (already compiled) costs ``new_bucket_cost`` once (its
    compile, in the same unit). Buckets are multiples of ``multiple``. Exact over contiguous groupings of the
    sorted lengths (dynamic programming, O(m^2) in the m distinct rounded lengths), which is where the optimum
    lies: a bucket always serves a run of consecutive lengths. Lengths clustered tightly (a benchmark built at
    fixed context sizes) get one bucket per cluster with almost no padding; spread lengths get a bucket every
    few percent where padding would cost more than a compile.
    """
    if len(lengths) == 0:
        return []
    rounded = np.array([round_up(max(n, 1), multiple) for n in lengths], dtype=np.int64)
    longest = int(rounded.max())
    ready_sizes = {int(r) for r in ready if int(r) >= int(rounded.min())}
    sizes = np.array(sorted(set(rounded.tolist()) | ready_sizes), dtype=np.int64)
    covered = np.searchsorted(np.sort(rounded), sizes, side="right")  # items of rounded length <= size
    per_item = np.array([float(cost(int(size))) for size in sizes])
    fixed = np.array([0.0 if int(size) in ready_sizes else float(new_bucket_cost) for size in sizes])
    best = np.zeros(len(sizes) + 1)  # best[j + 1]: every item <= sizes[j] served, sizes[j] the largest bucket
    came_from = np.zeros(len(sizes) + 1, dtype=np.int64)
    before = np.concatenate([[0], covered])
    for j in range(len(sizes)):
        options = best[: j + 1] + (covered[j] - before[: j + 1]) * per_item[j] + fixed[j]
        came_from[j + 1] = int(np.argmin(options))
        best[j + 1] = options[came_from[j + 1]]
    candidates = [j for j in range(len(sizes)) if sizes[j] >= longest]
    j = min(candidates, key=lambda k: best[k + 1])
    chosen = []
    while j >= 0:
        chosen.append(int(sizes[j]))
        j = int(came_from[j + 1]) - 1
    return sorted(chosen)


@dataclasses.dataclass(frozen=True)
class Batch:
    """Rows ``items`` (indices into the caller's sequence list) padded to ``rows`` x ``length``."""

    length: int
    rows: int
    items: tuple[int, ...]


def plan_batches(
    lengths: Sequence[int],
    *,
    max_rows: int,
    max_batch_tokens: int | None = None,
    length_multiple: int = 1,
    row_multiple: int = 1,
    extra_tokens: int = 0,
) -> list[Batch]:
    """Group sequence indices into static-shape batches.

    Rows per batch in a bucket: ``max_rows``, reduced so that rows * (bucket + ``extra_tokens``) stays within
    ``max_batch_tokens`` (never below one), then rounded up to ``row_multiple`` (the data-parallel size).
    """
    if not lengths:
        return []
    buckets = bucket_lengths(max(lengths), length_multiple)
    by_bucket: dict[int, list[int]] = {}
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        by_bucket.setdefault(bucket_for(lengths[index], buckets), []).append(index)
    batches = []
    for size in sorted(by_bucket, reverse=True):
        rows = max_rows
        if max_batch_tokens:
            rows = max(1, min(rows, max_batch_tokens // (size + extra_tokens)))
        rows = int(round_up(rows, row_multiple))
        members = by_bucket[size]
        for start in range(0, len(members), rows):
            batches.append(Batch(length=size, rows=rows, items=tuple(members[start:start + rows])))
    return batches


def pad_rows(sequences: Sequence[np.ndarray], batch: Batch, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [rows, length] right-padded with ``pad_id``, lengths int32 [rows]); dummy rows get length 1."""
    ids = np.full((batch.rows, batch.length), pad_id, dtype=np.int32)
    lengths = np.ones((batch.rows,), dtype=np.int32)
    for row, item in enumerate(batch.items):
        seq = np.asarray(sequences[item], dtype=np.int32)
        ids[row, : len(seq)] = seq
        lengths[row] = len(seq)
    return ids, lengths
