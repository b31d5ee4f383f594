"""Ring attention blocks of a sliding-window layer (Gemma 3's local layers, Mistral's windows): each device's
queries against the key block it holds, by XLA's blockwise attention on the tokens' *global* positions, so the
window (query i sees keys i - W < j <= i) and the causal mask hold across devices.

A device's tokens are one contiguous chunk, or two under zigzag order (chunks ``r`` and ``2n-1-r``,
``parallel.zigzag``). XLA's attention runs with query / key blocks that divide a chunk, so each of its blocks
holds consecutive positions and its own test (``xla_attention._block_skipped``: no query of the block sees any
key of the block) skips every block pair outside the window; a ring step none of whose chunk pairs the window
reaches is skipped whole (``lax.cond``), forward and backward. A local layer's ring thus computes about
``window / block + 1`` key blocks per query block instead of every earlier one (:func:`computed_blocks` counts
them with the kernel's own test). The key blocks still travel all the way round the ring (``ops.ring``).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from longrm_jax.ops.xla_attention import DEFAULT_BLOCK_Q, _block_skipped, xla_attention_bwd, xla_attention_with_lse


def merge_partial(out_acc, lse_acc, out, lse):
    """Combine two normalised partial attentions (out [B,T,H,D] fp32, lse [B,H,T]) over disjoint keys."""
    total = jnp.logaddexp(lse_acc, lse)  # -inf only when both are -inf

    def weight(x):  # exp(x - total), 0 where the partial result saw nothing
        w = jnp.where(jnp.isneginf(x), 0.0, jnp.exp(x - jnp.where(jnp.isneginf(total), 0.0, total)))
        return w.transpose(0, 2, 1)[..., None]

    return out_acc * weight(lse_acc) + out.astype(jnp.float32) * weight(lse), total


def chunk_length(t_local: int, zigzag: bool) -> int:
    return t_local // 2 if zigzag else t_local


def device_positions(dev, n: int, t_local: int, zigzag: bool, xp=jnp):
    """Global positions [t_local] of device ``dev``'s tokens (``dev`` may be traced)."""
    c = chunk_length(t_local, zigzag)
    starts = [dev * c, (2 * n - 1 - dev) * c] if zigzag else [dev * c]
    return xp.concatenate([s + xp.arange(c, dtype=xp.int32) for s in starts])


def _block(t_local: int, zigzag: bool) -> int:
    """XLA attention's query / key block for the ring: a divisor of the chunk, so no block spans two chunks."""
    return math.gcd(chunk_length(t_local, zigzag), DEFAULT_BLOCK_Q)


def step_needed(me, src, n: int, t_local: int, zigzag: bool, window: int):
    """Whether some query of device ``me`` sees some key of device ``src`` (per chunk pair: a key chunk not after
    the query chunk's last token and reaching into the window of its first)."""
    c = chunk_length(t_local, zigzag)
    q_starts = [me * c, (2 * n - 1 - me) * c] if zigzag else [me * c]
    kv_starts = [src * c, (2 * n - 1 - src) * c] if zigzag else [src * c]
    pairs = [(k0 <= q0 + c - 1) & (k0 + c - 1 > q0 - window) for q0 in q_starts for k0 in kv_starts]
    needed = pairs[0]
    for p in pairs[1:]:
        needed = needed | p
    return needed


def computed_blocks(n: int, t_local: int, zigzag: bool, window: int | None) -> int:
    """(query block, key block) pairs the whole ring computes for one row, decided by XLA attention's own skip
    test on the positions the ring passes it (``window=None``: the causal ring on the same blocks)."""
    block, count = _block(t_local, zigzag), 0
    for me in range(n):
        q_pos = device_positions(me, n, t_local, zigzag, np).reshape(-1, block)
        for src in range(n):
            if window is not None and not step_needed(me, src, n, t_local, zigzag, window):
                continue
            kv_pos = device_positions(src, n, t_local, zigzag, np).reshape(-1, block)
            count += sum(not bool(_block_skipped(qb, kb, True, window)) for qb in q_pos for kb in kv_pos)
    return count


def window_fwd_block(q, k, v, q_seg, kv_seg, me, src, *, n, zigzag, window, scale):
    """(out fp32 [B,T,H,D], lse [B,H,T]) of the local queries against device ``src``'s key block."""
    t = q.shape[1]
    block = _block(t, zigzag)

    def compute(_):
        out, lse = xla_attention_with_lse(
            q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=True, scale=scale, window=window,
            q_positions=device_positions(me, n, t, zigzag), kv_positions=device_positions(src, n, t, zigzag),
            block_q=block, block_k=block)
        return out.astype(jnp.float32), lse

    def skip(_):
        b, _, h, _ = q.shape
        return jnp.zeros(q.shape, jnp.float32), jnp.full((b, h, t), -jnp.inf, jnp.float32)

    return lax.cond(step_needed(me, src, n, t, zigzag, window), compute, skip, None)


def window_bwd_block(q, k, v, out, lse, dout, q_seg, kv_seg, me, src, *, n, zigzag, window, scale):
    """fp32 (dq, dk, dv) of device ``src``'s key block's share, from the global out / LSE."""
    t = q.shape[1]
    block = _block(t, zigzag)

    def compute(_):
        grads = xla_attention_bwd(
            q, k, v, out, lse, dout, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=True, scale=scale,
            window=window, q_positions=device_positions(me, n, t, zigzag),
            kv_positions=device_positions(src, n, t, zigzag), block_q=block, block_k=block)
        return tuple(g.astype(jnp.float32) for g in grads)

    def skip(_):
        return tuple(jnp.zeros(x.shape, jnp.float32) for x in (q, k, v))

    return lax.cond(step_needed(me, src, n, t, zigzag, window), compute, skip, None)
