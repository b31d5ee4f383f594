"""The attention entry point: ``attention`` / ``attention_with_lse`` and the choice of implementation.

Implementations (``impl``):
  ``xla``    blockwise flash-style attention in plain jnp (``ops.xla_attention``): runs everywhere; the
             numerical reference.
  ``cudnn``  ``jax.nn.dot_product_attention(implementation="cudnn")`` (GPU; segment ids are refused).
  ``pallas`` GPU: on Hopper+ the hybrid of tokamax's Mosaic GPU forward and cuDNN's flash backward fed
             tokamax's LSE (``ops.flash.HybridKernel``; with segment ids, tokamax's own backward);
             before Hopper tokamax's Triton kernels. TPU: splash attention.
  ``pallas-mosaic`` / ``pallas-triton``  tokamax alone (its own forward and backward), GPU.
  ``ring``   ``parallel.ring_attention`` over the ``seq`` mesh axis (tokens must be in zigzag order, see
             ``parallel.ring_attention.zigzag_permutation``), local blocks by the best single-device kernel.
  ``auto``   ring when the current mesh has a ``seq`` axis of size > 1; otherwise the fastest kernel for
             fwd+bwd that can honour the requested mask on this backend (H200, 32K-128K: the hybrid
             ``pallas`` > ``cudnn`` > ``pallas-mosaic``; see docs/benchmarks.md).

Shapes: q [B, T, Hq, D], k/v [B, S, Hkv, D], Hq % Hkv == 0; segment ids int32 [B, T] (0 = padding, which
attends only to padding). An implementation that cannot honour a mask raises; nothing is mis-masked.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from longrm_jax.ops.xla_attention import XlaBlockKernel, xla_attention_with_lse

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "pallas", "pallas-mosaic", "pallas-triton", "ring")
PALLAS_IMPLS = ("pallas", "pallas-mosaic", "pallas-triton")  # custom calls the compiler cannot partition


class AttentionNotSupportedError(ValueError):
    """The requested implementation cannot compute this attention (mask, backend or package missing)."""


# ``checkpoint_name``s of a kernel's forward outputs inside its custom VJP (flash kernels): a remat policy that
# saves these two keeps the backward from re-running the forward kernel.
ATTENTION_OUT_NAME = "attention_kernel_out"
ATTENTION_LSE_NAME = "attention_kernel_lse"


def _check_impl(impl):
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention impl {impl!r}; valid: {', '.join(IMPLEMENTATIONS)}")


def _split_segment_ids(segment_ids, t, s):
    """``segment_ids`` is [B, T] (self-attention, T == S) or a pair (q_segment_ids [B,T], kv_segment_ids [B,S])."""
    if segment_ids is None:
        return None, None
    if isinstance(segment_ids, (tuple, list)):
        q_seg, kv_seg = segment_ids
    else:
        if t != s:
            raise ValueError(
                f"segment_ids [B, T] needs T == S (got T={t}, S={s}); pass (q_segment_ids, kv_segment_ids)"
            )
        q_seg = kv_seg = segment_ids
    if q_seg.shape[-1] != t or kv_seg.shape[-1] != s:
        raise ValueError(f"segment ids shapes {q_seg.shape}/{kv_seg.shape} do not match T={t}, S={s}")
    return q_seg, kv_seg


def _check_shapes(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention expects q/k/v of rank 4 [B, T, H, D], got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k {k.shape} disagree on batch or head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]})")


def seq_axis_size(axis="seq"):
    """Size of ``axis`` in the current (abstract) mesh set by ``jax.set_mesh``; 1 when absent."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or axis not in mesh.axis_names:
        return 1
    return int(mesh.shape[axis])


@functools.cache
def _gpu_compute_capability():
    dev = jax.devices()[0]
    cc = getattr(dev, "compute_capability", None)
    return float(cc) if cc else 0.0


def mesh_size():
    """Number of devices of the current (abstract) mesh; 1 when none is set."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh is None or mesh.empty else int(mesh.size)


def resolve_impl(impl="auto", *, has_segment_ids=False, ring_axis="seq", cross_lengths=False):
    """The concrete implementation ``impl`` stands for on this backend and the current mesh.

    ``cross_lengths``: T != S (decoding against a cache): ``auto`` then picks ``xla``, which any mesh
    can partition and which aligns the causal mask to the end of the keys.
    """
    _check_impl(impl)
    if impl != "auto":
        return impl
    if cross_lengths:
        return "xla"
    if seq_axis_size(ring_axis) > 1:
        return "ring"
    return local_impl("auto", has_segment_ids=has_segment_ids)


@functools.cache
def warn_missing_tokamax(fallback: str) -> None:
    """Once per process: without tokamax a GPU runs a slower kernel (measured: 43.8% instead of 48.3% MFU
    training Qwen3-8B at 2 x 32K tokens on an H200), which otherwise goes unnoticed."""
    logging.getLogger(__name__).warning(
        "tokamax is not installed: attention on this GPU falls back from the 'pallas' kernel to %r (slower). "
        "Install the GPU extra: pip install \"longrm_jax[gpu]\"", fallback)


def local_impl(impl="auto", *, has_segment_ids=False):
    """The single-device kernel for ``impl`` (``auto`` -> fastest available that honours the mask)."""
    _check_impl(impl)
    if impl == "ring":
        raise ValueError("'ring' is not a single-device kernel")
    if impl != "auto":
        return impl
    backend = jax.default_backend()
    if backend == "tpu":
        return "pallas"
    if backend == "gpu":
        from longrm_jax.ops import flash

        # fwd+bwd on H200 (TFLOP/s at 32K): hybrid pallas ~ cuDNN's backward + a faster forward > cudnn 550
        # > tokamax mosaic alone 488. Only tokamax honours segment ids.
        if flash.hybrid_available() or (has_segment_ids and flash.tokamax_available()
                                        and _gpu_compute_capability() >= 9.0):
            return "pallas"
        if not flash.tokamax_available():
            warn_missing_tokamax("cudnn" if not has_segment_ids else "xla")
        if not has_segment_ids:
            return "cudnn"
    return "xla"


def block_kernel(impl="auto", *, has_segment_ids=False):
    """The single-device kernel object (``fwd``/``bwd`` with LSE residuals) that ring attention drives.

    ``impl`` may also be a kernel object itself (anything with those two methods), e.g. for tests.
    """
    if not isinstance(impl, str):
        return impl
    name = local_impl(impl, has_segment_ids=has_segment_ids)
    if name == "xla":
        return XlaBlockKernel
    from longrm_jax.ops import flash

    return flash.get_kernel(name)


def attention_with_lse(q, k, v, *, segment_ids=None, causal=True, impl="auto", scale=None):
    """Attention plus its log-sum-exp: ``(out [B,T,Hq,D] q.dtype, lse [B,Hq,T] fp32, natural log)``.

    ``lse[b, h, i] = log sum_j exp(scale * q_i . k_j)`` over the keys query i may see (``-inf`` when none).
    Differentiable through both outputs. Single-device kernels only (``ring`` is not accepted here).
    """
    _check_shapes(q, k, v)
    q_seg, kv_seg = _split_segment_ids(segment_ids, q.shape[1], k.shape[1])
    name = local_impl(impl, has_segment_ids=q_seg is not None)
    if name == "xla":
        return xla_attention_with_lse(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=causal,
                                      scale=scale)
    from longrm_jax.ops import flash

    kernel = flash.get_kernel(name)
    return kernel.attention_with_lse(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=causal,
                                     scale=scale)


def attention(q, k, v, *, segment_ids=None, causal=True, impl="auto", scale=None):
    """Multi-head attention with GQA, causal and packed-row (segment id) masks. See the module docstring.

    q [B, T, Hq, D], k/v [B, S, Hkv, D] -> [B, T, Hq, D] in q's dtype. ``scale`` defaults to D**-0.5.
    Under a mesh with ``seq`` > 1 (``auto`` or ``ring``) the tokens must be in zigzag order.
    """
    _check_shapes(q, k, v)
    q_seg, kv_seg = _split_segment_ids(segment_ids, q.shape[1], k.shape[1])
    name = resolve_impl(impl, has_segment_ids=q_seg is not None, cross_lengths=q.shape[1] != k.shape[1])
    if name in PALLAS_IMPLS and mesh_size() > 1 and q.shape[1] == k.shape[1] and q_seg is kv_seg:
        # Pallas custom calls cannot be partitioned by the compiler: run them per batch/head shard
        # (shard_map, a ring of one when there is no seq axis).
        name = "ring"
    if name == "ring":
        from longrm_jax.parallel.ring_attention import ring_attention

        if q.shape[1] != k.shape[1]:
            raise AttentionNotSupportedError(f"ring attention needs T == S (got {q.shape[1]} vs {k.shape[1]})")
        if q_seg is not kv_seg:
            raise AttentionNotSupportedError("ring attention takes one segment_ids array (self-attention)")
        return ring_attention(q, k, v, segment_ids=q_seg, causal=causal, scale=scale,
                              impl="auto" if impl in ("auto", "ring") else impl)
    if name == "xla":
        out, _ = xla_attention_with_lse(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, causal=causal,
                                        scale=scale)
        return out
    from longrm_jax.ops import flash

    return flash.get_kernel(name).attention(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg,
                                            causal=causal, scale=scale)


def dense_reference(q, k, v, *, segment_ids=None, causal=True, scale=None):
    """Naive O(T x S)-memory attention in fp32 (tests and small-size checks only)."""
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    q_seg, kv_seg = _split_segment_ids(segment_ids, t, s)
    qg = q.astype(jnp.float32).reshape(b, t, hkv, hq // hkv, d)
    hi = jax.lax.Precision.HIGHEST
    logits = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(jnp.float32), precision=hi) * scale
    mask = jnp.ones((t, s), bool)
    if causal:
        mask = jnp.tril(mask, k=s - t)
    mask = mask[None, None, None]
    if q_seg is not None:
        mask = mask & (q_seg[:, None, None, :, None] == kv_seg[:, None, None, None, :])
    logits = jnp.where(mask, logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = jnp.where(mask, probs, 0.0)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(jnp.float32), precision=hi)
    return out.reshape(b, t, hq, d)
