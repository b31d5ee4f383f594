"""cuDNN's flash attention called through JAX's *private* fused-attention primitives.

Why private: ``jax.nn.dot_product_attention(implementation="cudnn")`` only exposes forward + its own VJP,
and it rounds the softmax statistics it returns to the input dtype (bf16). Two things here need more:

- ``flash_backward(q, k, v, out, lse, dout)``: cuDNN's flash backward fed with *given* softmax statistics
  (natural-log ``lse = max + log(sum exp)`` of the scaled logits, fp32 [B, H, T]) and the given output.
  The backward recomputes ``p = exp(scale * q.k - lse)`` and ``delta = rowsum(out * dout)`` from what it
  is given, so any forward with the same statistics can feed it: tokamax's Mosaic forward (the
  ``pallas`` hybrid kernel) and ring attention's blocks (global out and global LSE).
- ``flash_forward(q, k, v)``: the forward with the statistics kept in fp32.

cuDNN's "softmax stats" are that natural-log LSE: the custom call's second forward output is fp32
[B, N, T] (B*segments with packing), it is what the backward consumes, and jax.nn returns it as the
``return_residual`` logsumexp (matching its XLA path's ``logsumexp(logits)``). The bench re-checks it on
the GPU (``max |lse_tokamax - lse_cudnn|`` and the gradients against fp32).

Version pin: written against jax 0.11.2 (``jax/_src/cudnn/fused_attention_stablehlo.py``; the primitive
signatures with ``page_table_k/v`` date from jax 0.5/0.6). The signatures are checked at import time;
any mismatch (or missing name) makes ``available()`` false with ``UNAVAILABLE_REASON`` set, and callers
fall back (the hybrid to tokamax's own VJP, with a logged warning). Known good: jax >= 0.11.2, < 0.12.

Sliding windows (``window=W``, causal only): cuDNN's ``sliding_window_length`` W shows query i the keys
``i - W < j <= i``, the contract's window (``ops.contract``; HF's ``sliding_window``), and skips the key blocks
wholly outside it, forward and backward.

Limits (``supports`` returns False, callers fall back): GPU of compute capability >= 9.0, bf16/fp16,
head_dim <= 256 and a multiple of 8, no segment ids (cuDNN's packed layout needs per-segment offsets
and lengths of one row layout; our segment masks are not passed through), causal only with T == S
(cuDNN's causal mask is top-left aligned; ours is aligned to the end of the keys).
"""

from __future__ import annotations

import functools
import inspect
import logging

import jax
import jax.numpy as jnp

from longrm_jax.parallel.target import target_of

log = logging.getLogger(__name__)

_BWD_PARAMS = ("query", "key", "value", "bias", "q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets",
               "page_table_k", "page_table_v", "activation", "fwd_output", "grad_output", "scale", "seed",
               "dropout_rate", "variadic_args", "mask_type", "layout", "sliding_window_length")
_FWD_PARAMS = ("query", "key", "value", "bias", "q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets",
               "page_table_k", "page_table_v", "scale", "seed", "dropout_rate", "variadic_args", "mask_type",
               "layout", "sliding_window_length", "is_training")


def _detect():
    """(module, None) when JAX's private cuDNN attention has the expected shape, else (None, reason)."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa  # noqa: PLC0415 - private API

        for impl, want in ((fa._dot_product_attention_bwd_impl, _BWD_PARAMS),
                           (fa._dot_product_attention_fwd_impl, _FWD_PARAMS)):
            got = tuple(inspect.signature(impl).parameters)
            if got != want:
                return None, f"{impl.__name__} has parameters {got}, expected {want}"
        _ = (fa._dot_product_attention_bwd_p_wrapper, fa._dot_product_attention_fwd_p_wrapper,
             fa.MaskType.CAUSAL, fa.MaskType.NO_MASK, fa.AttentionLayout.BTNH, fa.check_cudnn_version)
    except Exception as e:  # noqa: BLE001 - anything missing means "not available"
        return None, f"{type(e).__name__}: {e}"
    return fa, None


_FA, UNAVAILABLE_REASON = _detect()  # import-time feature detection (jax version drift)


def available() -> bool:
    """JAX's private cuDNN primitives have the signatures this module was written against."""
    return _FA is not None


def _cudnn_ok() -> bool:
    """The target GPU (``parallel.target``: the current mesh's devices) has compute capability >= 9.0 and
    this process has cuDNN (checked once per target kind)."""
    target = target_of()
    return target.is_gpu and _cudnn_ok_for(target.compute_capability)


@functools.cache
def _cudnn_ok_for(compute_capability: float) -> bool:
    if not available() or compute_capability < 9.0:
        return False
    try:
        _FA.check_cudnn_version()
    except Exception as e:  # noqa: BLE001
        log.warning("cuDNN flash attention unusable here (%s: %s)", type(e).__name__, e)
        return False
    return True


def supports(q, k, *, causal, has_segment_ids, check_device=True) -> bool:
    """Whether ``flash_forward``/``flash_backward`` compute exactly this attention on this machine."""
    if not available() or has_segment_ids or (check_device and not _cudnn_ok()):
        return False
    d = q.shape[-1]
    if q.dtype not in (jnp.bfloat16, jnp.float16) or k.dtype != q.dtype or d > 256 or d % 8:
        return False
    return not (causal and q.shape[1] != k.shape[1])


def _common(q, causal, scale, window=None):
    fa = _FA
    if window is not None and (not causal or int(window) < 1):
        raise ValueError(f"cuDNN's sliding window needs causal attention and window >= 1 (got window={window}, "
                         f"causal={causal})")
    unused = jnp.zeros(0, q.dtype)  # bias, seqlens, offsets, page tables: absent (as jax.nn passes them)
    params = dict(scale=float(q.shape[-1] ** -0.5 if scale is None else scale), seed=42, dropout_rate=0.0,
                  variadic_args=(False, False), mask_type=fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK,
                  layout=fa.AttentionLayout.BTNH.value,
                  sliding_window_length=None if window is None else int(window))
    return (unused,) * 7, params


def flash_forward(q, k, v, *, causal=True, scale=None, window=None):
    """cuDNN flash forward: ``(out [B,T,Hq,D] q.dtype, lse [B,Hq,T] fp32 natural log)``. Not differentiable.
    ``window``: causal sliding window (query i sees keys ``i - window < j <= i``)."""
    if not available():
        raise RuntimeError(f"JAX's private cuDNN attention API is unavailable: {UNAVAILABLE_REASON}")
    unused, params = _common(q, causal, scale, window)
    bias, q_len, kv_len, q_off, kv_off, pt_k, pt_v = unused
    out, stats = _FA._dot_product_attention_fwd_p_wrapper.bind(
        q, k, v, bias, q_len, kv_len, q_off, kv_off, pt_k, pt_v, is_training=True, **params)
    return out, stats


def flash_backward(q, k, v, out, lse, dout, *, causal=True, scale=None, window=None):
    """cuDNN flash backward from the given ``out`` [B,T,Hq,D] and ``lse`` [B,Hq,T] (natural log, fp32).

    Returns ``(dq, dk, dv)`` in the input dtypes (GQA: dk/dv have the kv heads). Rows whose ``lse`` is
    ``-inf`` (no visible key) cannot occur in the supported cases (no segment ids; causal needs T == S).
    """
    if not available():
        raise RuntimeError(f"JAX's private cuDNN attention API is unavailable: {UNAVAILABLE_REASON}")
    unused, params = _common(q, causal, scale, window)
    bias, q_len, kv_len, q_off, kv_off, pt_k, pt_v = unused
    grads = _FA._dot_product_attention_bwd_p_wrapper.bind(
        q, k, v, bias, q_len, kv_len, q_off, kv_off, pt_k, pt_v, lse.astype(jnp.float32),
        out.astype(q.dtype), dout.astype(q.dtype), **params)
    dq, dk, dv = grads[:3]
    return dq, dk, dv
