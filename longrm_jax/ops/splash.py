"""TPU splash attention (``impl="splash"``) with its log-sum-exp: a single-device kernel and ring blocks.

Built on ``jax.experimental.pallas.ops.tpu.splash_attention`` (multi-head form: the kernel groups query heads
over fewer key/value heads itself, query head n reading kv head n // (Hq / Hkv), our GQA convention):
  - forward: ``make_splash_mha(..., save_residuals=True)`` returns the output and the LSE;
  - backward: the kernel's own dq and dk/dv Pallas kernels, fed the out and LSE we give them. Ring attention
    gives the *global* out/LSE, which makes every block's gradient share exact (as the GPU blocks do). That
    entry point (``_splash_attention_bwd``) is private to JAX: its signature is checked at first use and a
    change raises ``AttentionNotSupportedError`` naming it, never a wrong gradient.
``interpret=True`` runs the same kernels in the Pallas interpreter on any backend (CPU tests).

Sizes. Splash tiles the sequence in blocks that are multiples of the TPU lane width (128). Lengths are padded
to a multiple of 128 and ``block_sizes`` picks the tiles per length and head dim: the largest of 512 (256 above
head dim 128), 256, 128 that divides the padded length. Padded keys are masked out (causal: they lie in every real query's
future; otherwise by a segment id no real token has), padded queries are dropped. Splash applies no softmax
scale: q is scaled first (in q's dtype, as TPU training does), and dq scaled back.
A query that sees no key gets out 0 and LSE ``-inf`` (splash itself would give the mean of v).
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp

from longrm_jax.ops.contract import AttentionNotSupportedError, round_up
from longrm_jax.ops.kernel_vjp import LseVjpKernel
from longrm_jax.ops.splash_tables import mask_info

LANES = 128  # TPU lane width: splash sequence blocks are multiples of it
_PAD_SEGMENT = jnp.iinfo(jnp.int32).min  # segment id of padding tokens: no real token has it
# Arguments of splash's private backward, in order (JAX 0.11); checked before use.
_BWD_PARAMS = ("save_residuals", "mask_value", "is_mqa", "block_sizes", "residual_checkpoint_name",
               "mask_function", "attn_logits_soft_cap", "interpret", "res", "do")


def _splash():
    from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415 - TPU kernels, on first use
        splash_attention_kernel,
        splash_attention_mask,
    )

    return splash_attention_kernel, splash_attention_mask


def padded_length(length: int) -> int:
    """Sequence lengths are padded to the lane width, never more (a longer block only when it divides)."""
    return round_up(max(length, 1), LANES)


def block_size(length: int, head_dim: int) -> int:
    """Sequence block for one axis: the largest of 512 (256 when head_dim > 128, to stay within VMEM), 256, 128
    that divides the padded length."""
    block = 512 if head_dim <= 128 else 256
    while padded_length(length) % block:
        block //= 2
    return block


def block_sizes(t: int, s: int, head_dim: int):
    """Splash ``BlockSizes`` for queries of length ``t`` and keys of length ``s`` (forward and backward)."""
    sk, _ = _splash()
    bq, bkv = block_size(t, head_dim), block_size(s, head_dim)
    return sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                         block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)


@functools.cache
def _kernel(t: int, s: int, head_dim: int, causal: bool, interpret: bool, window: int | None = None):
    """The splash kernel for padded lengths ``t`` x ``s``, built once per shape.

    Its mask tables (which blocks to visit, in what order) are numpy arrays built here on the host
    (``ops.splash_tables``: the tables jax's ``process_mask`` would build, in time linear in the blocks, not in
    the dense mask) and enter the program as constants. ``make_splash_mha`` would turn them into JAX arrays, i.e.
    run device ops while the caller traces: that fails where there is no device to run them (a program compiled
    for a TPU topology from a CPU host) and would copy the tables on each new trace on a real pod. One table set
    serves every head (all heads share the mask).
    """
    sk, _ = _splash()
    sizes = block_sizes(t, s, head_dim)
    fwd, mask_function = mask_info(t, s, (sizes.block_q, sizes.block_kv), causal, dkv=False, window=window)
    dq, _ = mask_info(t, s, (sizes.block_q_dq, sizes.block_kv_dq), causal, dkv=False, window=window)
    dkv, _ = mask_info(t, s, (sizes.block_q_dkv, sizes.block_kv_dkv), causal, dkv=True, window=window)
    return sk.SplashAttentionKernel(fwd, dq, dkv, block_sizes=sizes, is_mqa=False, save_residuals=True,
                                    mask_value=sk.DEFAULT_MASK_VALUE, attn_logits_soft_cap=None,
                                    residual_checkpoint_name=None, mask_function=mask_function, interpret=interpret)


@functools.cache
def _private_backward():
    sk, _ = _splash()
    bwd = getattr(sk, "_splash_attention_bwd", None)
    params = tuple(inspect.signature(bwd).parameters) if bwd is not None else None
    if params != _BWD_PARAMS:
        raise AttentionNotSupportedError(
            "splash backward from given out/LSE needs jax's splash_attention_kernel._splash_attention_bwd"
            f"{_BWD_PARAMS}; this jax ({jax.__version__}) has {params}")
    return bwd


class _Padded:
    """q/k/v in splash's [B, H, L, D] layout, padded to the block multiples, with the segment ids to use."""

    def __init__(self, q, k, v, q_seg, kv_seg, causal, scale, window=None):
        b, t, hq, d = q.shape
        s = k.shape[1]
        if window is not None and not causal:
            raise AttentionNotSupportedError(f"a sliding window needs causal attention (window={window})")
        self.window = None if window is None else int(window)
        if causal and t != s:
            raise AttentionNotSupportedError(f"splash causal attention needs T == S (got T={t}, S={s})")
        self.t, self.s, self.heads = t, s, hq
        self.tp, self.sp = padded_length(t), padded_length(s)  # causal: t == s, so the diagonal stays put
        self.scale = d**-0.5 if scale is None else float(scale)
        self.q = self._heads_first((q * jnp.asarray(self.scale, q.dtype)), self.tp)
        self.k, self.v = self._heads_first(k, self.sp), self._heads_first(v, self.sp)
        padded_keys = self.sp > s
        if q_seg is None and (causal or not padded_keys):
            self.segments = None
        else:
            if q_seg is None:
                q_seg, kv_seg = jnp.ones((b, t), jnp.int32), jnp.ones((b, s), jnp.int32)
            self.segments = (self._pad_ids(q_seg, self.tp), self._pad_ids(kv_seg, self.sp))
        self.causal = causal

    @staticmethod
    def _heads_first(x, length):
        x = jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)))
        return x.transpose(0, 2, 1, 3)

    @staticmethod
    def _pad_ids(ids, length):
        return jnp.pad(ids.astype(jnp.int32), ((0, 0), (0, length - ids.shape[1])), constant_values=_PAD_SEGMENT)

    def kernel(self, interpret):
        # A window's LocalMask, like the causal one, hides the padded keys (all in real queries' future).
        return _kernel(self.tp, self.sp, self.q.shape[-1], self.causal, bool(interpret), self.window)

    def per_row(self, fn, *extra):
        """``fn(q, k, v, segment_ids, *extra_rows)`` vmapped over the batch (splash takes one row)."""
        sk, _ = _splash()
        if self.segments is None:
            return jax.vmap(lambda q, k, v, *e: fn(q, k, v, None, *e))(self.q, self.k, self.v, *extra)
        return jax.vmap(lambda q, k, v, qs, ks, *e: fn(q, k, v, sk.SegmentIds(q=qs, kv=ks), *e))(
            self.q, self.k, self.v, *self.segments, *extra)

    def unpad_tokens(self, x_bhld, length):
        return x_bhld[:, :, :length].transpose(0, 2, 1, 3)


class SplashKernel(LseVjpKernel):
    """Splash attention as an ``ops`` kernel: ``attention``, ``attention_with_lse`` and the ring block
    interface ``fwd -> (out, lse)``, ``bwd(q, k, v, out, lse, dout)`` from the global out/LSE."""

    supports_ring_backward = True

    def __init__(self, interpret: bool = False):
        self.interpret = bool(interpret)
        self.name = "splash[interpret]" if interpret else "splash"

    def fwd(self, q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None, window=None):
        p = _Padded(q, k, v, q_segment_ids, kv_segment_ids, causal, scale, window)
        kernel = p.kernel(self.interpret)
        out, (lse,) = p.per_row(lambda q_, k_, v_, seg: kernel(q_, k_, v_, segment_ids=seg))
        lse = lse[:, :, : p.t]
        # Splash scores masked logits with a large finite negative: a row that saw no key has an LSE near it.
        seen = lse > 0.5 * kernel.kwargs["mask_value"]
        out = jnp.where(seen.transpose(0, 2, 1)[..., None], p.unpad_tokens(out, p.t), jnp.zeros((), q.dtype))
        return out.astype(q.dtype), jnp.where(seen, lse, -jnp.inf).astype(jnp.float32)

    def bwd(self, q, k, v, out, lse, dout, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None,
            window=None):
        backward = _private_backward()
        p = _Padded(q, k, v, q_segment_ids, kv_segment_ids, causal, scale, window)
        kernel = p.kernel(self.interpret)
        kw = kernel.kwargs
        # A row that saw no key anywhere: any finite LSE gives p = exp(masked logit - lse) = 0 there.
        lse = jnp.where(jnp.isneginf(lse), 0.0, lse).astype(jnp.float32)
        lse = jnp.pad(lse, ((0, 0), (0, 0), (0, p.tp - p.t)))
        # Padded queries get out = dout = 0, so they add nothing to dk, dv.
        out_h = _Padded._heads_first(out.astype(q.dtype), p.tp)
        dout_h = _Padded._heads_first(dout.astype(q.dtype), p.tp)

        def one(q_, k_, v_, seg, o_, l_, do_):
            res = (q_, k_, v_, seg, None, o_, l_, kernel.dq_mask_info, kernel.dkv_mask_info)
            grads = backward(False, kw["mask_value"], kw["is_mqa"], kw["block_sizes"], None, kw["mask_function"],
                             kw["attn_logits_soft_cap"], kw["interpret"], res, do_)
            return grads[3:6]

        dq, dk, dv = p.per_row(one, out_h, lse, dout_h)
        dq = p.unpad_tokens(dq, p.t).astype(jnp.float32) * p.scale
        return dq.astype(q.dtype), p.unpad_tokens(dk, p.s).astype(k.dtype), p.unpad_tokens(dv, p.s).astype(v.dtype)
