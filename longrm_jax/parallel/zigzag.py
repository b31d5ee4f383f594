"""Zigzag (dual-chunk) token order for causal ring attention over ``n`` sequence shards.

The global sequence is cut into 2n chunks and shard r holds chunks ``r`` and ``2n-1-r``, so every shard does
the same causal work. The reordering is done once, on the data side: reorder every [B, T] array (ids,
positions, segment ids, targets) with ``zigzag_reorder`` before the model, and undo it with
``zigzag_restore`` on per-token outputs whose order matters.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def zigzag_permutation(seq_len: int, n_shards: int) -> np.ndarray:
    """Index array ``perm`` with ``x_zigzag = x[:, perm]``: shard r gets chunks r and 2n-1-r of 2n chunks."""
    if seq_len % (2 * n_shards):
        raise ValueError(f"zigzag needs the sequence length ({seq_len}) divisible by 2 x shards ({2 * n_shards})")
    c = seq_len // (2 * n_shards)
    chunks = np.arange(seq_len).reshape(2 * n_shards, c)
    order = [i for r in range(n_shards) for i in (r, 2 * n_shards - 1 - r)]
    return chunks[order].reshape(-1)


def zigzag_inverse_permutation(seq_len: int, n_shards: int) -> np.ndarray:
    """``x == x_zigzag[:, inverse]``."""
    return np.argsort(zigzag_permutation(seq_len, n_shards))


def _take(x, idx, axis):
    return np.take(x, idx, axis=axis) if isinstance(x, np.ndarray) else jnp.take(x, idx, axis=axis)


def zigzag_reorder(x, n_shards: int, axis: int = 1):
    """Natural token order -> zigzag order along ``axis`` (numpy in, numpy out; jax in, jax out)."""
    return _take(x, zigzag_permutation(x.shape[axis], n_shards), axis)


def zigzag_restore(x, n_shards: int, axis: int = 1):
    """Zigzag token order -> natural order along ``axis``."""
    return _take(x, zigzag_inverse_permutation(x.shape[axis], n_shards), axis)
