"""Cached calls of a decoder whose sliding-window layers keep rings of their window: a split
:class:`~longrm_jax.models.cache.KVCache`, global layers at full length and local ones in ``local_k`` /
``local_v`` rings of R >= window slots. At 128K tokens Gemma 3's cache shrinks by about 5/6 (five local layers
of window 1024 per six).

Writes. Global layers write the new tokens' columns as an unsplit cache does (slots from ``cache.index``, or a
continuous-batching pool's ``write_at`` columns); local layers write each token at slot ``position % R`` of its
row, the tokens of a prefill longer than R but its last R dropped (:func:`models.cache.ring_targets`). A token at
position p then evicts position p - R <= p - window, which no later query of that row can see.

Reads. A prefill attends over the prompt itself (the fast kernels, the window applied there), never over the
ring, so a prompt longer than the window is exact. Other calls write, then attend over the layer's own cache
with the positions recorded in it (HF's rule i - W < j <= i on local layers): exact for T new tokens per row as
long as their writes evict nothing a query of the call still sees, T <= R - window + 1 (a decode step: T = 1).

Inside the scanned layer loop a layer's kind is traced: each layer scatters into both stacks at its index in
its own kind, the other stack's index out of range so that ``mode="drop"`` writes nothing there (a ``lax.cond``
around the writes could copy the whole carried cache), and only the attention runs under ``lax.cond``.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp

from longrm_jax.models.cache import KVCache, ring_targets
from longrm_jax.models.config import ModelConfig
from longrm_jax.models.layers import kernel_mask, layer_forward, stacked_cache_attention
from longrm_jax.models.local_layers import by_kind, is_local, rope_of


def kind_indices(cfg: ModelConfig, i):
    """(index of layer ``i`` among the global layers, among the local ones). The index in the other kind is
    None when the kind is static, else out of range (that kind's count: dropped by a ``mode="drop"`` write)."""
    flags = cfg.local_layers
    counts = [list(itertools.accumulate((f == kind for f in flags), initial=0))[:-1] for kind in (False, True)]
    local = is_local(cfg, i)
    if isinstance(local, bool) and isinstance(i, int):
        return (None, counts[1][i]) if local else (counts[0][i], None)
    if isinstance(local, bool):  # every layer one kind: i is its index in that kind
        return (None, i) if local else (i, None)
    n_global, n_local = flags.count(False), flags.count(True)
    global_index = jnp.asarray([n_global if f else c for f, c in zip(flags, counts[0])], jnp.int32)[i]
    local_index = jnp.asarray([c if f else n_local for f, c in zip(flags, counts[1])], jnp.int32)[i]
    return global_index, local_index


def _scatter(buffer, layer, rows, columns, values):
    """``buffer[layer, rows, columns] = values`` in place; a None layer writes nothing, one out of range is
    dropped."""
    if layer is None:
        return buffer
    return buffer.at[layer, rows, columns].set(values.astype(buffer.dtype), mode="drop")


def _masks(cache: KVCache, cfg: ModelConfig, positions, seg, length: int, prefill: bool):
    """((global mask, its decode-kernel mask) or None, (local ring mask, its kernel mask)), after the writes'
    metadata."""
    def with_kernel(mask):
        return mask, None if prefill else kernel_mask(mask, cfg.decode_attention, cfg.head_dim)

    global_masks = (with_kernel(cache.attention_mask(positions, seg, length)) if not all(cfg.local_layers)
                    else None)
    return global_masks, with_kernel(cache.attention_mask(positions, seg, length, window=cfg.sliding_window,
                                                          ring=True))


def split_cached_call(decoder, x, cache: KVCache, positions, seg, ropes, stacked, *, prefill: bool,
                      write_at, attend_fresh):
    """The cached branch of :meth:`Decoder.__call__` for a split cache: (hidden before the final norm, new
    cache). ``ropes``: (global cos/sin, local cos/sin or None); ``attend_fresh(local, q, k, v)``: attention over
    the call's own tokens."""
    cfg = decoder.config
    batch, length = positions.shape
    ring = cache.ring
    if not prefill and length > ring - cfg.sliding_window + 1:
        raise ValueError(f"a cached call of {length} new tokens per row over local rings of {ring} slots (window "
                         f"{cfg.sliding_window}) would evict keys its own queries see: at most "
                         f"{ring - cfg.sliding_window + 1}, or prefill=True on an empty cache")
    slots = ring_targets(positions, seg, ring)
    if write_at is None:
        rows, columns = jnp.arange(batch)[:, None], (cache.index + jnp.arange(length, dtype=jnp.int32))[None]
        ring_rows, ring_columns, take = rows, slots, (lambda a: a)
        cache = cache.write_meta(positions, seg).write_ring_meta(positions, seg, slots)
    else:  # one prompt scattered into a pool's row: its global metadata is the caller's
        rows, columns = write_at
        ring_rows, ring_columns, take = rows, slots[0], (lambda a: a[0])
        cache = cache.write_ring_meta(positions, seg, slots, row=rows)
    global_masks, local_masks = _masks(cache, cfg, positions, seg, length, prefill)

    def attend_cached(local, global_index, local_index, q, k_g, v_g, k_l, v_l):
        def on_local(q, k_g, v_g, k_l, v_l):
            mask, kernel = local_masks
            return stacked_cache_attention(q, k_l, v_l, local_index, mask, cfg.decode_attention, kernel,
                                           scale=cfg.attention_scale)

        def on_global(q, k_g, v_g, k_l, v_l):
            mask, kernel = global_masks
            return stacked_cache_attention(q, k_g, v_g, global_index, mask, cfg.decode_attention, kernel,
                                           scale=cfg.attention_scale)

        return by_kind(local, on_local, on_global, q, k_g, v_g, k_l, v_l)

    def body(carry, p, i):
        x, k_g, v_g, k_l, v_l = carry
        local = is_local(cfg, i)
        global_index, local_index = kind_indices(cfg, i)

        def attend(q, k, v):
            k_g2, v_g2 = (_scatter(a, global_index, rows, columns, take(b)) for a, b in ((k_g, k), (v_g, v)))
            k_l2, v_l2 = (_scatter(a, local_index, ring_rows, ring_columns, take(b)) for a, b in ((k_l, k), (v_l, v)))
            if prefill:  # the prompt attends over itself, whatever the ring keeps
                out = attend_fresh(local, q, k, v)
            else:
                out = attend_cached(local, global_index, local_index, q, k_g2, v_g2, k_l2, v_l2)
            return out, (k_g2, v_g2, k_l2, v_l2)

        x, new = layer_forward(p, x, *rope_of(local, *ropes), cfg, decoder.rules, attend)
        return (x, *new)

    unroll = cfg.unroll_cached_layers and not prefill
    x, k_g, v_g, k_l, v_l = decoder._run_layers(body, (x, cache.k, cache.v, cache.local_k, cache.local_v),
                                                stacked, unroll=unroll)
    return x, dataclasses.replace(cache, k=k_g, v=v_g, local_k=k_l, local_v=v_l,
                                  index=cache.index + (0 if write_at is not None else length))
