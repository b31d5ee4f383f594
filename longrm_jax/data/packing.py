"""Packing tokenized groups into fixed-length rows and rows into [B, T] batches (docs/design.md "Batches").

- A *group* (`TokenizedGroup`) is one SFT sample or one preference group (chosen + R rejected); it is never
  split: all its samples go to one row, contiguously, chosen first.
- Rows are filled first-fit-decreasing up to the largest bucket; a row then takes the smallest bucket
  length that holds it, so only `len(buckets)` shapes ever reach the compiler.
- A sample longer than the largest bucket is cut on its own (`data.tokenize` policies: by default the middle
  of its prompt goes, the response stays) or raises (`"error"`); a group is never cut as a whole. A group
  still longer than the largest bucket gets a row of its own of `group_size x` that length (upstream's rule:
  each sequence cut at the row length, a bucket row holds all of a group's sequences), batched apart.
- A preference group whose chosen and a rejected are identical (nothing to learn) is dropped, logged and
  counted (`TruncationStats`), so it never enters the loss normaliser.
- Batches: rows of one bucket, `batch_rows` at a time; leftover rows move up to the next bucket; leftovers of
  the largest bucket are completed with empty rows (`num_groups == 0`, all padding).
- Slotted rows (`slots=k`, the "rows" layout of preference training): one group per row, its k samples in k
  equal slots of `length / k` tokens (sample r starts at `r * length / k`), each right-padded. A row then costs
  `k * longest sample`. The trainer reshapes such a batch to [B, k, length / k]: one sequence per row, so
  attention needs no segment ids (on GPU the cuDNN flash backward, which packed rows cannot use).

Batch dict (numpy int32): `input_ids`, `positions`, `segment_ids`, `loss_mask` [B, T] and `num_groups` [B].
Segment of sample r (0 = chosen) of group g in a row: `g * group_size + r + 1`; padding: segment 0,
position 0, loss_mask 0, input id `pad_id`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from longrm_jax.data.records import DataError
from longrm_jax.data.tokenize import (TokenizedGroup, TruncationConfig, TruncationStats, truncate_sample)

logger = logging.getLogger(__name__)

BATCH_KEYS = ("input_ids", "positions", "segment_ids", "loss_mask")


def make_buckets(max_length: int, num_buckets: int = 4, multiple: int = 128, scheme: str = "halving") -> tuple[int, ...]:
    """Row lengths, rounded up to `multiple`, ascending, deduplicated: `max_length / 2^k` (k < num_buckets,
    scheme "halving": few compiles, coarse at the top) or `max_length * (k + 1) / num_buckets` (scheme
    "linear": at most max_length / num_buckets padding per row, e.g. for long sequences of similar length)."""
    if max_length <= 0 or num_buckets <= 0 or multiple <= 0:
        raise ValueError("max_length, num_buckets and multiple must be positive")
    if scheme not in ("halving", "linear"):
        raise ValueError(f"bucket scheme must be halving or linear; got {scheme!r}")
    out = set()
    for k in range(num_buckets):
        raw = max_length >> k if scheme == "halving" else max_length * (k + 1) // num_buckets
        length = -(-raw // multiple) * multiple
        out.add(min(max(length, multiple), -(-max_length // multiple) * multiple))
    return tuple(sorted(out))


def fit_group(group: TokenizedGroup, capacity: int, policy: str, eos_id: int,
              stats: TruncationStats | None = None) -> TokenizedGroup:
    """Every sample longer than `capacity` cut on its own (`policy`: see `data.tokenize`; "error" raises).

    A group is never cut as a whole: one still longer than `capacity` in total gets a row of its own.
    """
    if max(len(s) for s in group.samples) <= capacity:
        return group
    p = group.provenance
    if policy == "error":
        raise DataError(p.source, p.where(), None, f"sample of {max(len(s) for s in group.samples)} tokens is "
                        f"longer than the row length {capacity} (truncation policy 'error')")
    cfg = TruncationConfig(policy=policy)
    samples = tuple(truncate_sample(s, cfg, eos_id, p, max_length=capacity, stats=stats) for s in group.samples)
    if stats is not None:
        stats.record(0, sum(o.truncated and not s.truncated for s, o in zip(group.samples, samples)),
                     group.num_tokens - sum(len(s) for s in samples), f"{p.source} {p.where()}")
    return TokenizedGroup(samples, p)


def fit_group_slots(group: TokenizedGroup, slot: int, policy: str, eos_id: int,
                    stats: TruncationStats | None = None) -> TokenizedGroup:
    """Slotted rows: every sample cut on its own to `slot` tokens (the same rule as `fit_group`)."""
    return fit_group(group, slot, policy, eos_id, stats)


def is_untrainable(group: TokenizedGroup) -> bool:
    """A preference group whose chosen equals one of its rejected token for token: zero gradient, no signal."""
    chosen = group.samples[0]
    return len(group.samples) > 1 and any(
        len(r) == len(chosen) and np.array_equal(r.input_ids, chosen.input_ids)
        and np.array_equal(r.loss_mask, chosen.loss_mask) for r in group.samples[1:])


def drop_untrainable(groups: Sequence[TokenizedGroup], stats: TruncationStats | None = None
                     ) -> list[TokenizedGroup]:
    """`groups` without the untrainable ones (`is_untrainable`), counted. One warning names the first dropped
    pair (per `stats`, else per call); the rest are counted in `stats`' summary line, never a line each."""
    out, dropped = [], []
    for g in groups:
        (dropped if is_untrainable(g) else out).append(g)
    if dropped:
        where = f"{dropped[0].provenance.source} {dropped[0].provenance.where()}"
        first = stats.count("identical_pairs_dropped", len(dropped), where) if stats is not None else True
        if first:
            logger.warning("%s: chosen and rejected are identical after tokenization and cutting; the pair is "
                           "dropped (it cannot train and would only dilute the loss)%s", where,
                           "; further drops are counted in the data summary line" if stats is not None
                           else f"; {len(dropped)} such pairs dropped here")
    return out


@dataclasses.dataclass
class PackedRow:
    groups: list[TokenizedGroup]
    used: int = 0


def _row_cost(group: TokenizedGroup, slots: int | None) -> int:
    return group.num_tokens if slots is None else slots * max(len(s) for s in group.samples)


def pack_rows(groups: Sequence[TokenizedGroup], capacity: int, slots: int | None = None,
              max_groups: int | None = None) -> list[PackedRow]:
    """First-fit-decreasing bin packing (deterministic: ties keep input order). Groups must fit `capacity`;
    `max_groups`: at most that many groups per row (1: a row per group, e.g. upstream SFT's one sample per step).

    With `slots`, every group gets a row of its own, costing `slots * longest sample` (see the module notes).
    """
    order = sorted(range(len(groups)), key=lambda i: (-_row_cost(groups[i], slots), i))
    rows: list[PackedRow] = []
    for i in order:
        g = groups[i]
        n = _row_cost(g, slots)
        if n > capacity:
            raise ValueError(f"group of {n} tokens exceeds row capacity {capacity}; call fit_group first")
        if slots is not None:
            rows.append(PackedRow([g], n))
            continue
        for row in rows:
            if row.used + n <= capacity and (max_groups is None or len(row.groups) < max_groups):
                row.groups.append(g)
                row.used += n
                break
        else:
            rows.append(PackedRow([g], n))
    # Within a row, keep the groups in their original (shuffled) order: FFD order would sort by length.
    rank = {id(g): i for i, g in enumerate(groups)}
    for row in rows:
        row.groups.sort(key=lambda g: rank[id(g)])
    return rows


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest of ``buckets`` (ascending) that holds ``length``: packed training rows and the evaluator's
    batches (evaluation.batching) alike."""
    for b in buckets:
        if length <= b:
            return b
    raise ValueError(f"length {length} exceeds the largest bucket {buckets[-1]}")


def _fill_row(row: PackedRow | None, length: int, group_size: int, pad_id: int, out: dict, b: int,
              slotted: bool = False) -> None:
    out["input_ids"][b, :] = pad_id
    if row is None:
        return
    t = 0
    for g_idx, group in enumerate(row.groups):
        if len(group.samples) != group_size:
            p = group.provenance
            raise ValueError(f"{p.source} {p.where()}: group has {len(group.samples)} samples, "
                             f"expected {group_size}")
        for r, s in enumerate(group.samples):
            n = len(s)
            if slotted:
                t = r * (length // group_size)
            out["input_ids"][b, t:t + n] = s.input_ids
            out["loss_mask"][b, t:t + n] = s.loss_mask
            out["positions"][b, t:t + n] = np.arange(n, dtype=np.int32)
            out["segment_ids"][b, t:t + n] = g_idx * group_size + r + 1
            t += n
    out["num_groups"][b] = len(row.groups)


def rows_to_batch(rows: Sequence[PackedRow | None], length: int, group_size: int, pad_id: int,
                  slotted: bool = False) -> dict:
    """Stack rows (None = empty row) into one batch of row length `length` (`slotted`: see the module notes)."""
    if slotted and length % group_size:
        raise ValueError(f"slotted rows: length {length} is not a multiple of the group size {group_size}")
    bsz = len(rows)
    out = {k: np.zeros((bsz, length), np.int32) for k in BATCH_KEYS}
    out["num_groups"] = np.zeros((bsz,), np.int32)
    for b, row in enumerate(rows):
        if row is not None and row.used > length:
            raise ValueError(f"row of {row.used} tokens does not fit length {length}")
        _fill_row(row, length, group_size, pad_id, out, b, slotted)
    return out


def rows_to_batches(rows: Sequence[PackedRow], buckets: Sequence[int], batch_rows: int, group_size: int,
                    pad_id: int, slotted: bool = False) -> list[dict]:
    """Group rows by bucket into batches of `batch_rows`; leftovers go up a bucket, then get empty rows."""
    buckets = sorted(buckets)
    by_bucket: dict[int, list[PackedRow]] = {b: [] for b in buckets}
    for row in rows:
        by_bucket[bucket_for(row.used, buckets)].append(row)
    batches = []
    carry: list[PackedRow] = []
    for i, b in enumerate(buckets):
        pending = carry + by_bucket[b]
        full = len(pending) // batch_rows * batch_rows
        for start in range(0, full, batch_rows):
            batches.append(rows_to_batch(pending[start:start + batch_rows], b, group_size, pad_id, slotted))
        carry = pending[full:]
        if i == len(buckets) - 1 and carry:
            padded: list[PackedRow | None] = list(carry) + [None] * (batch_rows - len(carry))
            batches.append(rows_to_batch(padded, b, group_size, pad_id, slotted))
    return batches


def own_row_length(capacity: int, group_size: int) -> int:
    """Row length for a group too long to share a row: room for each of its samples at full length."""
    return group_size * capacity


def plan_rows(groups: Sequence[TokenizedGroup], capacity: int, group_size: int, eos_id: int,
              policy: str = "prompt_middle", stats: TruncationStats | None = None, max_groups: int | None = None
              ) -> tuple[list[PackedRow], list[PackedRow]]:
    """(shared rows of up to `capacity` tokens, own rows of one long group each) for `groups`.

    Each sample is cut on its own to `capacity` (`fit_group`); untrainable pairs are dropped
    (`drop_untrainable`); a group still longer than `capacity` gets a row of its own of `own_row_length`.
    """
    fitted = drop_untrainable([fit_group(g, capacity, policy, eos_id, stats) for g in groups], stats)
    shared = [g for g in fitted if g.num_tokens <= capacity]
    own = [PackedRow([g], g.num_tokens) for g in fitted if g.num_tokens > capacity]
    if own and stats is not None:
        stats.count("own_row_groups", len(own))
    return pack_rows(shared, capacity, max_groups=max_groups), own


def pack_batches(groups: Sequence[TokenizedGroup], buckets: Sequence[int], batch_rows: int, group_size: int,
                 pad_id: int, eos_id: int, policy: str = "prompt_middle",
                 stats: TruncationStats | None = None, slotted: bool = False,
                 max_groups: int | None = None) -> list[dict]:
    """Fit, pack and batch `groups` (one window of the pipeline). Deterministic in its inputs.

    Shared rows are batched by `buckets`; groups too long to share the largest row (`plan_rows`) come in
    batches of their own, of row length `own_row_length(max(buckets), group_size)`.
    `slotted`: one group per row in `group_size` equal slots (buckets must be multiples of `group_size`).
    """
    capacity = max(buckets)
    if slotted:
        if any(b % group_size for b in buckets):
            raise ValueError(f"slotted rows: buckets {tuple(buckets)} must be multiples of {group_size}")
        fitted = [fit_group_slots(g, capacity // group_size, policy, eos_id, stats) for g in groups]
        rows = pack_rows(drop_untrainable(fitted, stats), capacity, group_size)
        return rows_to_batches(rows, buckets, batch_rows, group_size, pad_id, slotted)
    rows, own = plan_rows(groups, capacity, group_size, eos_id, policy, stats, max_groups)
    batches = rows_to_batches(rows, buckets, batch_rows, group_size, pad_id)
    if own:
        batches += rows_to_batches(own, (own_row_length(capacity, group_size),), batch_rows, group_size, pad_id)
    return batches


def batch_spec(batch_rows: int, length: int) -> dict[str, tuple[tuple[int, ...], type]]:
    """Shapes and dtypes of one batch of row length `length`."""
    spec = {k: ((batch_rows, length), np.int32) for k in BATCH_KEYS}
    spec["num_groups"] = ((batch_rows,), np.int32)
    return spec


def unpack_row(batch: dict, b: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input_ids, loss_mask) of every segment of row `b`, in segment order (for tests and inspection)."""
    seg = batch["segment_ids"][b]
    out = []
    for s in range(1, int(seg.max(initial=0)) + 1):
        idx = np.nonzero(seg == s)[0]
        out.append((batch["input_ids"][b, idx], batch["loss_mask"][b, idx]))
    return out
