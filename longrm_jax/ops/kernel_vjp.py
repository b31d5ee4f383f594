"""``attention_with_lse`` for a kernel that offers the block interface ``fwd -> (out, lse)`` and
``bwd(q, k, v, out, lse, dout) -> (dq, dk, dv)``: a custom VJP whose backward is the kernel's own, fed the
forward's out and LSE (which it saves under checkpoint names a remat policy can keep). ``LseVjpKernel`` is the
base class that gives such a kernel its ``attention`` / ``attention_with_lse`` methods.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.custom_derivatives import SymbolicZero

from longrm_jax.ops.contract import ATTENTION_LSE_NAME, ATTENTION_OUT_NAME, window_kwargs


def lse_vjp_kernel(fwd, bwd):
    """``attention_with_lse`` from a kernel's fwd/bwd: differentiable through ``out`` (LSE cotangent refused)."""

    # kv_seg None with q_seg given means "the same array" (self-attention): kernels may test identity.
    def _kv(q_seg, kv_seg):
        return q_seg if kv_seg is None else kv_seg

    @functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
    def f(q, k, v, q_seg, kv_seg, causal, scale, window=None):
        return fwd(q, k, v, q_segment_ids=q_seg, kv_segment_ids=_kv(q_seg, kv_seg), causal=causal, scale=scale,
                   **window_kwargs(window))

    def f_fwd(q, k, v, q_seg, kv_seg, causal, scale, window=None):
        q, k, v, q_seg, kv_seg = jax.tree.map(lambda p: p.value, (q, k, v, q_seg, kv_seg))
        out, lse = fwd(q, k, v, q_segment_ids=q_seg, kv_segment_ids=_kv(q_seg, kv_seg), causal=causal,
                       scale=scale, **window_kwargs(window))
        # Named so that a remat policy can keep exactly these two (the backward's only kernel outputs) and
        # recompute q, k, v: see models.layers.save_attention_policy.
        out, lse = checkpoint_name(out, ATTENTION_OUT_NAME), checkpoint_name(lse, ATTENTION_LSE_NAME)
        return (out, lse), (q, k, v, out, lse, q_seg, kv_seg)

    def f_bwd(causal, scale, window, res, cts):
        q, k, v, out, lse, q_seg, kv_seg = res
        dout, dlse = cts
        if not isinstance(dlse, SymbolicZero):
            raise NotImplementedError("gradient through the LSE output is only implemented by impl='xla'")
        if isinstance(dout, SymbolicZero):
            dout = jnp.zeros(out.shape, out.dtype)
        dq, dk, dv = bwd(q, k, v, out, lse, dout, q_segment_ids=q_seg, kv_segment_ids=_kv(q_seg, kv_seg),
                         causal=causal, scale=scale, **window_kwargs(window))
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None

    f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
    return f


class LseVjpKernel:
    """Base of the kernels with ``fwd``/``bwd``: differentiable ``attention_with_lse`` and ``attention``."""

    @functools.cached_property
    def _with_lse(self):
        return lse_vjp_kernel(self.fwd, self.bwd)

    def attention_with_lse(self, q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None,
                           window=None):
        kv_seg = None if kv_segment_ids is q_segment_ids else kv_segment_ids
        return self._with_lse(q, k, v, q_segment_ids, kv_seg, bool(causal), scale, window)

    def attention(self, q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None,
                  window=None):
        return self.attention_with_lse(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                       causal=causal, scale=scale, window=window)[0]
