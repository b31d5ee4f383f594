"""The attention entry point: ``attention`` / ``attention_with_lse`` and the choice of implementation.

Implementations (``impl``):
  ``xla``    blockwise flash-style attention in plain jnp (``ops.xla_attention``): runs everywhere; the
             numerical reference.
  ``cudnn``  ``jax.nn.dot_product_attention(implementation="cudnn")`` (GPU; segment ids are refused).
  ``pallas`` GPU: on Hopper+ the hybrid of tokamax's Mosaic GPU forward and cuDNN's flash backward fed
             tokamax's LSE (``ops.flash.HybridKernel``; with segment ids, tokamax's own backward);
             before Hopper tokamax's Triton kernels. TPU: splash attention.
  ``pallas-mosaic`` / ``pallas-triton``  tokamax alone (its own forward and backward), GPU.
  ``splash`` TPU splash attention with its LSE (``ops.splash``); ``auto`` on TPU. ``interpret=True`` runs it
             in the Pallas interpreter on any backend (tests).
  ``ring``   ``ops.ring`` over the ``seq`` mesh axis (tokens must be in zigzag order, see
             ``parallel.zigzag.zigzag_permutation``), local blocks by the best single-device kernel.
  ``auto``   see ``ops.dispatch``: ring when the current mesh has a ``seq`` axis of size > 1, otherwise the
             fastest single-device kernel that honours the mask.

Shapes: q [B, T, Hq, D], k/v [B, S, Hkv, D], Hq % Hkv == 0; segment ids int32 [B, T] (0 = padding, which
attends only to padding). ``window`` W (causal only; HF's ``sliding_window``): query i sees key j iff
``i - W < j <= i`` (within its segment). An implementation that cannot honour a mask or a window raises
(``contract.check_window``; ``auto`` picks one that can); nothing is mis-masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from longrm_jax.ops import flash
from longrm_jax.ops.contract import (
    PALLAS_IMPLS,
    AttentionNotSupportedError,
    check_interpret,
    check_window,
    check_shapes,
    mesh_size,
    split_segment_ids,
    window_kwargs,
)
from longrm_jax.ops.dispatch import local_impl, resolve_impl
from longrm_jax.ops.ring import ring_attention
from longrm_jax.ops.xla_attention import xla_attention_with_lse

def attention_with_lse(q, k, v, *, segment_ids=None, causal=True, impl="auto", scale=None, interpret=False,
                       window=None):
    """Attention plus its log-sum-exp: ``(out [B,T,Hq,D] q.dtype, lse [B,Hq,T] fp32, natural log)``.

    ``lse[b, h, i] = log sum_j exp(scale * q_i . k_j)`` over the keys query i may see (``-inf`` when none).
    Differentiable through both outputs (the kernels other than ``xla``: through ``out``). Single-device kernels
    only (``ring`` is not accepted here). ``interpret``: ``splash`` in the Pallas interpreter (any backend).
    """
    check_shapes(q, k, v)
    q_seg, kv_seg = split_segment_ids(segment_ids, q.shape[1], k.shape[1])
    name = local_impl(impl, has_segment_ids=q_seg is not None, dtype=q.dtype, window=window)
    check_interpret(name, interpret)
    check_window(name, window, causal)
    if name == "xla":
        return xla_attention_with_lse(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=causal,
                                      scale=scale, window=window)
    kernel = flash.get_kernel(name, interpret)
    return kernel.attention_with_lse(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=causal,
                                     scale=scale, **window_kwargs(window))


def attention(q, k, v, *, segment_ids=None, causal=True, impl="auto", scale=None, interpret=False, window=None):
    """Multi-head attention with GQA, causal and packed-row (segment id) masks. See the module docstring.

    q [B, T, Hq, D], k/v [B, S, Hkv, D] -> [B, T, Hq, D] in q's dtype. ``scale`` defaults to D**-0.5.
    Under a mesh with ``seq`` > 1 (``auto`` or ``ring``) the tokens must be in zigzag order. ``interpret``:
    run ``splash`` (also as ring blocks) in the Pallas interpreter, on any backend (tests).
    """
    check_shapes(q, k, v)
    q_seg, kv_seg = split_segment_ids(segment_ids, q.shape[1], k.shape[1])
    name = resolve_impl(impl, has_segment_ids=q_seg is not None, cross_lengths=q.shape[1] != k.shape[1],
                        dtype=q.dtype, window=window)
    # Ring attention honours a window on XLA blocks (ring_attention refuses other block kernels).
    check_window("xla" if name == "ring" and impl in ("auto", "ring") else name, window, causal)
    if name in PALLAS_IMPLS and mesh_size() > 1 and q.shape[1] == k.shape[1] and q_seg is kv_seg:
        # Pallas custom calls cannot be partitioned by the compiler: run them per batch/head shard
        # (shard_map, a ring of one when there is no seq axis).
        name = "ring"
    if name == "ring":
        if q.shape[1] != k.shape[1]:
            raise AttentionNotSupportedError(f"ring attention needs T == S (got {q.shape[1]} vs {k.shape[1]})")
        if q_seg is not kv_seg:
            raise AttentionNotSupportedError("ring attention takes one segment_ids array (self-attention)")
        return ring_attention(q, k, v, segment_ids=q_seg, causal=causal, scale=scale,
                              impl="auto" if impl in ("auto", "ring") else impl, interpret=interpret, window=window)
    check_interpret(name, interpret)
    if name == "xla":
        out, _ = xla_attention_with_lse(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=causal,
                                        scale=scale, window=window)
        return out
    return flash.get_kernel(name, interpret).attention(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg,
                                            causal=causal, scale=scale, **window_kwargs(window))


def dense_reference(q, k, v, *, segment_ids=None, causal=True, scale=None, window=None):
    """Naive O(T x S)-memory attention in fp32 (tests and small-size checks only)."""
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    q_seg, kv_seg = split_segment_ids(segment_ids, t, s)
    qg = q.astype(jnp.float32).reshape(b, t, hkv, hq // hkv, d)
    hi = jax.lax.Precision.HIGHEST
    logits = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(jnp.float32), precision=hi) * scale
    mask = jnp.ones((t, s), bool)
    if causal:
        mask = jnp.tril(mask, k=s - t)
        if window is not None:  # keys more than window - 1 behind the (end-aligned) query are hidden
            mask = mask & ~jnp.tril(jnp.ones((t, s), bool), k=s - t - window)
    mask = mask[None, None, None]
    if q_seg is not None:
        mask = mask & (q_seg[:, None, None, :, None] == kv_seg[:, None, None, None, :])
    logits = jnp.where(mask, logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = jnp.where(mask, probs, 0.0)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(jnp.float32), precision=hi)
    return out.reshape(b, t, hq, d)
