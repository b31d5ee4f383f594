"""Blockwise (flash-style) attention in plain jnp: the reference implementation that runs everywhere.

Queries and keys are both cut into blocks; for each query block an online softmax runs over the key blocks,
so memory grows like ``T x block`` rather than ``T x S``. GQA is handled by viewing the query heads as
``[Hkv, G]`` groups, never by repeating K/V. The backward pass is written by hand (``jax.custom_vjp``,
FlashAttention-2 style): it recomputes each block's probabilities from the saved log-sum-exp, so the only
residuals are q, k, v, the output and the LSE.

Masking is expressed through integer *positions* (causal: key j visible to query i iff ``kv_pos[j] <=
q_pos[i]``; with a sliding ``window`` W also ``kv_pos[j] > q_pos[i] - W``) and *segment ids* (visible iff
equal). Blocks that the causal mask or the window hides completely are skipped with ``lax.cond`` (the compute
really is not executed; under ``vmap`` it would become a select, which is why the block loops here are
``lax.scan``s, never vmapped).

A query row that sees no key at all gets output 0 and LSE ``-inf`` (ring attention relies on this).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from longrm_jax.ops.contract import PAD_POSITION as _PAD_POSITION
from longrm_jax.ops.contract import round_up as _round_up

DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512


def _precision(dtype):
    # fp32 inputs are the reference path: ask for true fp32 matmuls (TF32 on GPU would lose ~1e-3).
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT


def _block_mask(q_pos, kv_pos, q_seg, kv_seg, causal, kv_padded, window=None):
    """Boolean mask broadcastable to [B, K, G, bq, bk], or None when every pair is visible."""
    mask = None
    if causal:
        visible = kv_pos[None, :] <= q_pos[:, None]
        if window is not None:  # HF's sliding window: the W latest keys up to the query itself
            visible = visible & (kv_pos[None, :] > q_pos[:, None] - window)
        mask = visible[None, None, None]
    elif kv_padded:
        mask = (kv_pos < _PAD_POSITION)[None, None, None, None, :]
    if q_seg is not None:
        seg = (q_seg[:, :, None] == kv_seg[:, None, :])[:, None, None]
        mask = seg if mask is None else mask & seg
    return mask


def _block_skipped(q_pos, kv_pos, causal, window=None):
    """True when no query of the block can see any key of the block (so the block's work is skipped): a
    sliding window's layer computes only the blocks within reach of its window."""
    all_padding = jnp.min(kv_pos) >= _PAD_POSITION
    if not causal:
        return all_padding
    skipped = all_padding | (jnp.min(kv_pos) > jnp.max(q_pos))
    if window is not None:
        real_kv = jnp.where(kv_pos >= _PAD_POSITION, -_PAD_POSITION, kv_pos)
        skipped = skipped | (jnp.max(real_kv) <= jnp.min(q_pos) - window)
    return skipped


def _to_blocks_q(x, block):  # [B, T, K, G, D] -> [nq, B, K, G, bq, D]
    b, t, k, g, d = x.shape
    return x.reshape(b, t // block, block, k, g, d).transpose(1, 0, 3, 4, 2, 5)


def _from_blocks_q(x):  # [nq, B, K, G, bq, D] -> [B, T, K, G, D]
    n, b, k, g, bq, d = x.shape
    return x.transpose(1, 0, 4, 2, 3, 5).reshape(b, n * bq, k, g, d)


def _to_blocks_kv(x, block):  # [B, S, K, D] -> [nk, B, K, bk, D]
    b, s, k, d = x.shape
    return x.reshape(b, s // block, block, k, d).transpose(1, 0, 3, 2, 4)


def _from_blocks_kv(x):  # [nk, B, K, bk, D] -> [B, S, K, D]
    n, b, k, bk, d = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(b, n * bk, k, d)


def _blocks_1d(x, block):  # [T] -> [n, block]
    return x.reshape(-1, block)


def _blocks_seg(x, block):  # [B, T] -> [n, B, block]
    return None if x is None else x.reshape(x.shape[0], -1, block).transpose(1, 0, 2)


def _forward_blocks(q, k, v, q_pos, kv_pos, q_seg, kv_seg, causal, scale, block_q, block_k, kv_padded,
                    window=None):
    """q [B,T,K,G,D], k/v [B,S,K,D] (T, S multiples of the blocks) -> out [B,T,K,G,D] (q dtype), lse [B,K,G,T]."""
    prec = _precision(q.dtype)
    qb, qpb, qsb = _to_blocks_q(q, block_q), _blocks_1d(q_pos, block_q), _blocks_seg(q_seg, block_q)
    kb, vb = _to_blocks_kv(k, block_k), _to_blocks_kv(v, block_k)
    kpb, ksb = _blocks_1d(kv_pos, block_k), _blocks_seg(kv_seg, block_k)

    def one_q_block(xs):
        q_i, qp_i, qs_i = xs
        b, kh, g, bq, d = q_i.shape

        def kv_step(carry, kv_xs):
            k_j, v_j, kp_j, ks_j = kv_xs

            def compute(carry):
                m, l, acc = carry
                s = jnp.einsum("bkgqd,bksd->bkgqs", q_i, k_j, precision=prec,
                               preferred_element_type=jnp.float32) * scale
                mask = _block_mask(qp_i, kp_j, qs_i, ks_j, causal, kv_padded, window)
                if mask is not None:
                    s = jnp.where(mask, s, -jnp.inf)
                m_new = jnp.maximum(m, jnp.max(s, axis=-1))
                # Rows with nothing visible yet keep m = -inf; shift them by 0 so exp() gives 0, not NaN.
                m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)
                p = jnp.exp(s - m_safe[..., None])
                alpha = jnp.exp(m - m_safe)
                l = l * alpha + jnp.sum(p, axis=-1)
                pv = jnp.einsum("bkgqs,bksd->bkgqd", p.astype(v_j.dtype), v_j, precision=prec,
                                preferred_element_type=jnp.float32)
                return m_new, l, acc * alpha[..., None] + pv

            skip = _block_skipped(qp_i, kp_j, causal, window)
            return lax.cond(skip, lambda c: c, compute, carry), None

        init = (jnp.full((b, kh, g, bq), -jnp.inf, jnp.float32), jnp.zeros((b, kh, g, bq), jnp.float32),
                jnp.zeros((b, kh, g, bq, d), jnp.float32))
        (m, l, acc), _ = lax.scan(kv_step, init, (kb, vb, kpb, ksb))
        seen = l > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
        return out.astype(q.dtype), lse

    out_b, lse_b = lax.map(one_q_block, (qb, qpb, qsb))
    lse = lse_b.transpose(1, 2, 3, 0, 4).reshape(lse_b.shape[1], lse_b.shape[2], lse_b.shape[3], -1)
    return _from_blocks_q(out_b), lse


def _backward_blocks(q, k, v, out, lse, dout, dlse, q_pos, kv_pos, q_seg, kv_seg, causal, scale, block_q,
                     block_k, kv_padded, window=None):
    """Gradients of (out, lse) w.r.t. q, k, v, given the (possibly *global*, as in ring attention) out/lse.

    Shapes as in ``_forward_blocks``; ``dlse`` [B,K,G,T] may be None. Returns fp32 dq, dk, dv.
    """
    prec = _precision(q.dtype)
    # delta_i = sum_d dout*out - dlse_i: dS_ij = P_ij (dP_ij - delta_i) covers both cotangents.
    delta = jnp.einsum("btkgd,btkgd->bkgt", dout.astype(jnp.float32), out.astype(jnp.float32))
    if dlse is not None:
        delta = delta - dlse
    lse_safe = jnp.where(jnp.isneginf(lse), 0.0, lse)
    nq = q.shape[1] // block_q

    def lse_blocks(x):  # [B,K,G,T] -> [nq, B, K, G, bq]
        b, kh, g, _ = x.shape
        return x.reshape(b, kh, g, nq, block_q).transpose(3, 0, 1, 2, 4)

    qb, dob = _to_blocks_q(q, block_q), _to_blocks_q(dout, block_q)
    lseb, deltab = lse_blocks(lse_safe), lse_blocks(delta)
    qpb, qsb = _blocks_1d(q_pos, block_q), _blocks_seg(q_seg, block_q)
    kb, vb = _to_blocks_kv(k, block_k), _to_blocks_kv(v, block_k)
    kpb, ksb = _blocks_1d(kv_pos, block_k), _blocks_seg(kv_seg, block_k)

    def kv_block(dq_all, kv_xs):
        k_j, v_j, kp_j, ks_j = kv_xs

        def q_step(carry, q_xs):
            q_i, do_i, lse_i, delta_i, qp_i, qs_i, dq_i = q_xs

            def compute(carry):
                dk_j, dv_j = carry
                s = jnp.einsum("bkgqd,bksd->bkgqs", q_i, k_j, precision=prec,
                               preferred_element_type=jnp.float32) * scale
                p = jnp.exp(s - lse_i[..., None])
                mask = _block_mask(qp_i, kp_j, qs_i, ks_j, causal, kv_padded, window)
                if mask is not None:
                    p = jnp.where(mask, p, 0.0)
                dv_j = dv_j + jnp.einsum("bkgqs,bkgqd->bksd", p.astype(do_i.dtype), do_i, precision=prec,
                                         preferred_element_type=jnp.float32)
                dp = jnp.einsum("bkgqd,bksd->bkgqs", do_i, v_j, precision=prec,
                                preferred_element_type=jnp.float32)
                ds = (p * (dp - delta_i[..., None])).astype(q_i.dtype)
                dq_new = dq_i + scale * jnp.einsum("bkgqs,bksd->bkgqd", ds, k_j, precision=prec,
                                                   preferred_element_type=jnp.float32)
                dk_j = dk_j + scale * jnp.einsum("bkgqs,bkgqd->bksd", ds, q_i, precision=prec,
                                                 preferred_element_type=jnp.float32)
                return (dk_j, dv_j), dq_new

            skip = _block_skipped(qp_i, kp_j, causal, window)
            carry, dq_i = lax.cond(skip, lambda c: (c, dq_i), compute, carry)
            return carry, dq_i

        zeros = jnp.zeros(k_j.shape, jnp.float32)
        (dk_j, dv_j), dq_all = lax.scan(q_step, (zeros, zeros), (qb, dob, lseb, deltab, qpb, qsb, dq_all))
        return dq_all, (dk_j, dv_j)

    dq0 = jnp.zeros(qb.shape, jnp.float32)
    dq_b, (dk_b, dv_b) = lax.scan(kv_block, dq0, (kb, vb, kpb, ksb))
    return _from_blocks_q(dq_b), _from_blocks_kv(dk_b), _from_blocks_kv(dv_b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11, 12))
def _flash(q, k, v, q_pos, kv_pos, q_seg, kv_seg, causal, scale, block_q, block_k, kv_padded, window):
    return _forward_blocks(q, k, v, q_pos, kv_pos, q_seg, kv_seg, causal, scale, block_q, block_k, kv_padded,
                           window)


def _flash_fwd(q, k, v, q_pos, kv_pos, q_seg, kv_seg, causal, scale, block_q, block_k, kv_padded, window):
    out, lse = _forward_blocks(q, k, v, q_pos, kv_pos, q_seg, kv_seg, causal, scale, block_q, block_k,
                               kv_padded, window)
    return (out, lse), (q, k, v, out, lse, q_pos, kv_pos, q_seg, kv_seg)


def _flash_bwd(causal, scale, block_q, block_k, kv_padded, window, res, cotangents):
    q, k, v, out, lse, q_pos, kv_pos, q_seg, kv_seg = res
    dout, dlse = cotangents
    dq, dk, dv = _backward_blocks(q, k, v, out, lse, dout, dlse, q_pos, kv_pos, q_seg, kv_seg, causal, scale,
                                  block_q, block_k, kv_padded, window)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


class _Layout:
    """Padding to whole blocks and the GQA view, shared by forward and backward entry points."""

    def __init__(self, q, k, q_pos, kv_pos, q_seg, kv_seg, block_q, block_k):
        b, t, hq, d = q.shape
        s, hkv = k.shape[1], k.shape[2]
        if hq % hkv:
            raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
        self.b, self.t, self.s, self.hq, self.hkv, self.d = b, t, s, hq, hkv, d
        self.block_q = min(block_q, _round_up(t, 8))
        self.block_k = min(block_k, _round_up(s, 8))
        self.tp, self.sp = _round_up(t, self.block_q), _round_up(s, self.block_k)
        self.kv_padded = self.sp != s
        self.q_pos = jnp.pad(q_pos.astype(jnp.int32), (0, self.tp - t), constant_values=_PAD_POSITION - 1)
        self.kv_pos = jnp.pad(kv_pos.astype(jnp.int32), (0, self.sp - s), constant_values=_PAD_POSITION)
        if q_seg is not None:
            self.q_seg = jnp.pad(q_seg.astype(jnp.int32), ((0, 0), (0, self.tp - t)), constant_values=-2)
            self.kv_seg = jnp.pad(kv_seg.astype(jnp.int32), ((0, 0), (0, self.sp - s)), constant_values=-1)
        else:
            self.q_seg = self.kv_seg = None

    def q_in(self, x):  # [B,T,Hq,D] -> [B,Tp,K,G,D]
        x = jnp.pad(x, ((0, 0), (0, self.tp - self.t), (0, 0), (0, 0)))
        return x.reshape(self.b, self.tp, self.hkv, self.hq // self.hkv, self.d)

    def kv_in(self, x):
        return jnp.pad(x, ((0, 0), (0, self.sp - self.s), (0, 0), (0, 0)))

    def q_out(self, x):  # [B,Tp,K,G,D] -> [B,T,Hq,D]
        return x.reshape(self.b, self.tp, self.hq, self.d)[:, : self.t]

    def lse_in(self, x):  # [B,Hq,T] -> [B,K,G,Tp]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, self.tp - self.t)), constant_values=-jnp.inf)
        return x.reshape(self.b, self.hkv, self.hq // self.hkv, self.tp)

    def lse_out(self, x):  # [B,K,G,Tp] -> [B,Hq,T]
        return x.reshape(self.b, self.hq, self.tp)[:, :, : self.t]


def _check_window(window, causal):
    if window is None:
        return None
    if not causal or int(window) < 1:
        raise ValueError(f"a sliding window needs causal attention and window >= 1 (got window={window}, "
                         f"causal={causal})")
    return int(window)


def _default_positions(t, s, causal):
    # Causal with T != S aligns the last query with the last key (decoding against a cache).
    return jnp.arange(t, dtype=jnp.int32) + (s - t if causal else 0), jnp.arange(s, dtype=jnp.int32)


def xla_attention_with_lse(q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None,
                           q_positions=None, kv_positions=None, block_q=DEFAULT_BLOCK_Q,
                           block_k=DEFAULT_BLOCK_K, window=None):
    """Blockwise attention returning ``(out [B,T,Hq,D] in q's dtype, lse [B,Hq,T] fp32, natural log)``.

    Differentiable w.r.t. q, k, v through both outputs. ``q_positions``/``kv_positions`` ([T]/[S] int32,
    shared over the batch) define the causal mask; by default queries are aligned to the end of the keys.
    ``window`` (causal only): query i sees key j iff ``q_pos[i] - window < kv_pos[j] <= q_pos[i]``; key
    blocks wholly outside every query's window are skipped.
    """
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    window = _check_window(window, causal)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    dq_pos, dkv_pos = _default_positions(q.shape[1], k.shape[1], causal)
    q_pos = dq_pos if q_positions is None else q_positions
    kv_pos = dkv_pos if kv_positions is None else kv_positions
    lay = _Layout(q, k, q_pos, kv_pos, q_segment_ids, kv_segment_ids, block_q, block_k)
    out, lse = _flash(lay.q_in(q), lay.kv_in(k), lay.kv_in(v), lay.q_pos, lay.kv_pos, lay.q_seg, lay.kv_seg,
                      bool(causal), scale, lay.block_q, lay.block_k, lay.kv_padded, window)
    return lay.q_out(out), lay.lse_out(lse)


def xla_attention_bwd(q, k, v, out, lse, dout, *, q_segment_ids=None, kv_segment_ids=None, causal=True,
                      scale=None, q_positions=None, kv_positions=None, block_q=DEFAULT_BLOCK_Q,
                      block_k=DEFAULT_BLOCK_K, window=None):
    """dq, dk, dv (fp32) of one q/kv block pair, from the *global* ``out`` and ``lse`` of the queries.

    With the global (all-blocks) out/lse, the result is exactly this key block's share of the gradient:
    dq summed over key blocks, dk/dv of this block. Used by ring attention's backward pass.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    dq_pos, dkv_pos = _default_positions(q.shape[1], k.shape[1], causal)
    q_pos = dq_pos if q_positions is None else q_positions
    kv_pos = dkv_pos if kv_positions is None else kv_positions
    lay = _Layout(q, k, q_pos, kv_pos, q_segment_ids, kv_segment_ids, block_q, block_k)
    dq, dk, dv = _backward_blocks(lay.q_in(q), lay.kv_in(k), lay.kv_in(v), lay.q_in(out), lay.lse_in(lse),
                                  lay.q_in(dout), None, lay.q_pos, lay.kv_pos, lay.q_seg, lay.kv_seg,
                                  bool(causal), scale, lay.block_q, lay.block_k, lay.kv_padded,
                                  _check_window(window, causal))
    return lay.q_out(dq), dk[:, : lay.s], dv[:, : lay.s]


class XlaBlockKernel:
    """The block-kernel interface ring attention drives (every implementation offers the same two calls).

    ``fwd`` -> (out in q's dtype, lse [B,Hq,T] fp32); ``bwd`` -> (dq, dk, dv) from the global out/lse.
    ``causal`` means the square, aligned causal mask (T == S, query i sees keys 0..i).
    """

    name = "xla"
    supports_ring_backward = True

    @staticmethod
    def fwd(q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None):
        return xla_attention_with_lse(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                      causal=causal, scale=scale)

    @staticmethod
    def bwd(q, k, v, out, lse, dout, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None):
        return xla_attention_bwd(q, k, v, out, lse, dout, q_segment_ids=q_segment_ids,
                                 kv_segment_ids=kv_segment_ids, causal=causal, scale=scale)
