"""Splash attention's block tables (``MaskInfo``) for the two masks we use, built in time linear in the blocks.

Splash visits the (query block, key block) grid guided by three tables: ``block_mask`` (0 empty, 1 partial,
2 full), ``data_next`` (which block to fetch next) and, for masks it cannot compute in the kernel, the partial
blocks themselves. jax builds them (``splash_attention_mask_info.process_mask``) by materializing every block of
the dense mask in numpy and walking the grid in Python: work proportional to the dense mask (queries x keys),
which is 4.7 CPU seconds at 32K x 32K and hours at 1M x 1M (docs/compile_only.md). Our masks are plain:
causal (``CausalMask``, query i sees keys j <= i), its sliding-window form (``LocalMask``, also j > i - W) and
full (``FullMask``); packed documents enter the kernel
as segment ids at run time, not through these tables. Their block kinds follow from the block index ranges
alone, and the rest of the tables follows from ``block_mask`` with array operations, so building them costs a
few array passes over the block grid.

The tables are exactly those of ``process_mask`` / ``process_mask_dkv`` with one head shard, one query shard,
``shrink_grid=True`` and downcast scalar-memory tables (tests/test_ops_splash_tables.py compares every array).
What they encode, as jax builds them:
  - ``data_next`` at grid point g is the key (forward, dq: row-major walk over query rows) or query (dkv:
    column-major walk over key columns) block index of the first non-empty block at or after g in the walk,
    wrapping to the first one;
  - shrinking keeps, per query row (per key column for dkv), only the non-empty blocks in order, padded with 0
    at the end of a row (at the start of a column for dkv) to the longest.
"""

from __future__ import annotations

import numpy as np


def _downcast(array: np.ndarray) -> np.ndarray:
    """The smallest of int8 / int16 / int32 holding every (non-negative) entry, as splash stores scalar tables."""
    top = int(array.max()) if array.size else 0
    for dtype in (np.int8, np.int16):
        if top <= np.iinfo(dtype).max:
            return array.astype(dtype)
    return array.astype(np.int32)


def block_kinds(q_len: int, kv_len: int, block_q: int, block_kv: int, causal: bool,
                window: int | None = None) -> np.ndarray:
    """int32 [q blocks, kv blocks]: 0 where the mask is empty on the block, 1 partial, 2 full. Causal: query i
    sees key j iff i >= j, so block (a, b) is non-empty iff its last query reaches its first key and full iff
    its first query reaches its last key. A sliding ``window`` W also needs j > i - W: non-empty iff the last key
    is in the first query's window, full iff the first key is in the last query's."""
    nq, nkv = q_len // block_q, kv_len // block_kv
    if not causal:
        return np.full((nq, nkv), 2, np.int32)
    q0 = np.arange(nq, dtype=np.int64)[:, None] * block_q
    k0 = np.arange(nkv, dtype=np.int64)[None, :] * block_kv
    any_ = q0 + block_q - 1 >= k0
    full = q0 >= k0 + block_kv - 1
    if window is not None:
        any_ = any_ & (k0 + block_kv - 1 > q0 - window)
        full = full & (k0 > q0 + block_q - 1 - window)
    return np.where(full, 2, np.where(any_, 1, 0)).astype(np.int32)


def _data_next(kinds: np.ndarray, dkv: bool) -> np.ndarray:
    walk = kinds.T if dkv else kinds  # the walk's order: row-major over [q, kv], or over [kv, q] for dkv
    flat = np.flatnonzero(walk.ravel())
    if flat.size == 0:
        return np.zeros(kinds.shape, np.int32)
    nxt = np.searchsorted(flat, np.arange(walk.size))
    nxt[nxt == flat.size] = 0  # past the last non-empty block: wrap to the first
    out = (flat[nxt] % walk.shape[1]).astype(np.int32).reshape(walk.shape)
    return out.T if dkv else out


def _shrink_rows(kinds: np.ndarray, tables: list[np.ndarray]) -> list[np.ndarray]:
    """Each table at the non-empty blocks only, per query row, left-aligned (forward, dq); 0 in the padding."""
    rows, cols = np.nonzero(kinds)  # row-major: ascending columns within a row
    counts = np.count_nonzero(kinds, axis=1)
    width = int(counts.max()) if counts.size else 0
    slot = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
    out = []
    for t in tables:
        s = np.zeros((kinds.shape[0], width), np.int32)
        s[rows, slot] = t[rows, cols]
        out.append(s)
    return out


def _shrink_columns(kinds: np.ndarray, tables: list[np.ndarray]) -> list[np.ndarray]:
    """Each table at the non-empty blocks only, per key column, bottom-aligned (dkv); 0 in the padding."""
    cols, rows = np.nonzero(kinds.T)  # column-major: ascending rows within a column
    counts = np.count_nonzero(kinds, axis=0)
    height = int(counts.max()) if counts.size else 0
    within = np.arange(cols.size) - np.repeat(np.cumsum(counts) - counts, counts)
    slot = height - counts[cols] + within  # padding goes first in a column
    out = []
    for t in tables:
        s = np.zeros((height, kinds.shape[1]), np.int32)
        s[slot, cols] = t[rows, cols]
        out.append(s)
    return out


def mask_info(q_len: int, kv_len: int, block_shape: tuple[int, int], causal: bool, dkv: bool,
              window: int | None = None):
    """``(MaskInfo, mask_function)`` as ``process_mask`` (``dkv``: ``process_mask_dkv``) returns them for a
    multi-head ``CausalMask((q_len, kv_len))`` (``causal``), ``LocalMask((q_len, kv_len), (window - 1, 0), 0)``
    (``causal`` with a sliding ``window``: query i sees keys i - window < j <= i) or ``FullMask``, with one head
    and query shard."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415 - TPU kernels, on first use
        splash_attention_mask,
        splash_attention_mask_info,
    )

    block_q, block_kv = block_shape
    if q_len % block_q or kv_len % block_kv:
        raise ValueError(f"splash blocks {block_shape} must divide the mask ({q_len}, {kv_len})")
    if window is not None and not causal:
        raise ValueError(f"a sliding window needs a causal mask (window={window})")
    kinds = block_kinds(q_len, kv_len, block_q, block_kv, causal, window)
    shrink = _shrink_columns if dkv else _shrink_rows
    kinds_s, data_next = shrink(kinds, [kinds, _data_next(kinds, dkv)])
    q_sequence = mask_function = None
    if causal:  # computed in the kernel: no partial blocks or mask_next table to load
        computable = (splash_attention_mask.CausalMask((q_len, kv_len)) if window is None else
                      splash_attention_mask.LocalMask((q_len, kv_len), (window - 1, 0), 0))
        q_sequence, mask_function = computable.q_sequence, computable.mask_function
    info = splash_attention_mask_info.MaskInfo(
        data_next=_downcast(data_next[None]), mask_next=None, block_mask=_downcast(kinds_s[None]),
        partial_mask_blocks=None, q_sequence=q_sequence)
    return info, mask_function
