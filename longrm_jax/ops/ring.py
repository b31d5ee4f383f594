"""Ring attention over a sequence mesh axis, with zigzag (dual-chunk) load balancing.

Each of the ``n`` devices on the ``seq`` axis holds T/n tokens of q, k, v. Key/value blocks (and their
segment ids) travel around the ring with ``lax.ppermute``; at every step a device attends its queries to
the key block it holds with a single-device kernel that also returns the log-sum-exp, and merges the
partial results by LSE (online softmax). The next step's ``ppermute`` is issued before the current block's
compute so the transfer can overlap it. The steps are unrolled in Python (n is small and static) so the
compiler sees the whole schedule.

Backward (``jax.custom_vjp``): K/V circulate again together with dK/dV accumulators that travel with
them and arrive home after n hops. Each block's gradient is computed from the *global* output and LSE
saved by the forward pass, which makes every block's share exact (autodiff through a kernel's LSE output
is not reliable: cuDNN drops that cotangent).

Causal masking and load balance. With ``zigzag=True`` the global sequence is cut into 2n chunks and device
r holds chunks ``r`` and ``2n-1-r`` (``parallel.zigzag``), so every device does the same work:
  - step 0 (its own block): a causal call on the local tokens (local order is increasing in global order);
  - a block from device j < r: all local queries see exactly the first half of the keys (non-causal call);
  - a block from device j > r: exactly the second half of the queries see all the keys (non-causal call).
Every off-diagonal step is thus a half-size call with no mask, chosen with ``lax.cond``: the hidden half
is never computed. With ``zigzag=False`` (contiguous shards) blocks from later devices are skipped with
``lax.cond`` (the device idles: contiguous causal rings are unbalanced, which is why zigzag is default).

The token reordering is done once, on the data side (``parallel.zigzag``): reorder every [B, T] array (ids,
positions, segment ids, targets) with ``zigzag_reorder`` before the model, and undo it with ``zigzag_restore``
on per-token outputs if their order matters. Attention itself is order-agnostic apart from the causal mask.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from longrm_jax.ops import cudnn_flash
from longrm_jax.ops.contract import (ATTENTION_LSE_NAME, ATTENTION_OUT_NAME, AttentionNotSupportedError,
                                     check_shapes)
from longrm_jax.ops.dispatch import block_kernel, local_impl
from longrm_jax.ops.ring_window import merge_partial, window_bwd_block, window_fwd_block
from longrm_jax.parallel.placement import BATCH_AXES, divisible_axes

HEAD_AXIS = "tensor"


# ------------------------------------------------------------------------------------------ LSE helpers


def _pad_half(x, axis, first):
    """Put ``x`` into the first or second half of an array twice its size along ``axis`` (zeros elsewhere)."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, x.shape[axis]) if first else (x.shape[axis], 0)
    return jnp.pad(x, pad)


def _halves(x, axis):
    h = x.shape[axis] // 2
    return lax.slice_in_dim(x, 0, h, axis=axis), lax.slice_in_dim(x, h, 2 * h, axis=axis)


def _seg_halves(seg):
    return (None, None) if seg is None else _halves(seg, 1)


# ------------------------------------------------------------------------------------ per-device ring


def _block_case(step, src, me, causal, zigzag):
    """Static kind of the block at ``step``: 'diag', 'full', or a traced choice (returned as None)."""
    if step == 0:
        return "diag" if causal else "full"
    if not causal:
        return "full"
    return None  # depends on src < me: decided with lax.cond


def _fwd_block(kernel, step, src, me, q, k, v, q_seg, kv_seg, causal, zigzag, scale):
    """(out fp32 [B,T,H,D], lse [B,H,T]) of the local queries against the key block from device ``src``."""

    def call(q_, k_, v_, qs, ks, c):
        out, lse = kernel.fwd(q_, k_, v_, q_segment_ids=qs, kv_segment_ids=ks, causal=c, scale=scale)
        return out.astype(jnp.float32), lse

    case = _block_case(step, src, me, causal, zigzag)
    if case == "diag":  # own block: kv segment ids are q's (passing the same array lets kernels know)
        return call(q, k, v, q_seg, q_seg, True)
    if case == "full":
        return call(q, k, v, q_seg, kv_seg, False)

    b, t, h, _ = q.shape
    if zigzag:
        def earlier(_):  # all queries see the first key chunk
            k0, v0 = _halves(k, 1)[0], _halves(v, 1)[0]
            return call(q, k0, v0, q_seg, _seg_halves(kv_seg)[0], False)

        def later(_):  # the second query chunk sees both key chunks
            out, lse = call(_halves(q, 1)[1], k, v, _seg_halves(q_seg)[1], kv_seg, False)
            return _pad_half(out, 1, first=False), jnp.concatenate(
                [jnp.full((b, h, t // 2), -jnp.inf, jnp.float32), lse], axis=2)
    else:
        def earlier(_):
            return call(q, k, v, q_seg, kv_seg, False)

        def later(_):  # a block wholly in the future: nothing to compute
            return jnp.zeros(q.shape, jnp.float32), jnp.full((b, h, t), -jnp.inf, jnp.float32)

    return lax.cond(src < me, earlier, later, None)


def _bwd_block(kernel, step, src, me, q, k, v, out, lse, dout, q_seg, kv_seg, causal, zigzag, scale):
    """fp32 (dq, dk, dv) of this key block's share, from the global out/lse."""

    def call(q_, k_, v_, o_, l_, do_, qs, ks, c):
        grads = kernel.bwd(q_, k_, v_, o_, l_, do_, q_segment_ids=qs, kv_segment_ids=ks, causal=c, scale=scale)
        return tuple(g.astype(jnp.float32) for g in grads)

    case = _block_case(step, src, me, causal, zigzag)
    if case == "diag":
        return call(q, k, v, out, lse, dout, q_seg, q_seg, True)
    if case == "full":
        return call(q, k, v, out, lse, dout, q_seg, kv_seg, False)

    if zigzag:
        def earlier(_):
            k0, v0 = _halves(k, 1)[0], _halves(v, 1)[0]
            dq, dk, dv = call(q, k0, v0, out, lse, dout, q_seg, _seg_halves(kv_seg)[0], False)
            return dq, _pad_half(dk, 1, first=True), _pad_half(dv, 1, first=True)

        def later(_):
            dq, dk, dv = call(_halves(q, 1)[1], k, v, _halves(out, 1)[1], _halves(lse, 2)[1],
                              _halves(dout, 1)[1], _seg_halves(q_seg)[1], kv_seg, False)
            return _pad_half(dq, 1, first=False), dk, dv
    else:
        def earlier(_):
            return call(q, k, v, out, lse, dout, q_seg, kv_seg, False)

        def later(_):
            return (jnp.zeros(q.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32),
                    jnp.zeros(v.shape, jnp.float32))

    return lax.cond(src < me, earlier, later, None)


def _ring_perm(n):
    return [(i, (i + 1) % n) for i in range(n)]  # at step s device r holds the block of device r - s


def _ring_forward(q, k, v, q_seg, kv_seg, *, axis, n, kernel, causal, zigzag, scale, window):
    me = lax.axis_index(axis) if n > 1 else 0
    perm = _ring_perm(n)
    b, t, h, d = q.shape
    out_acc = jnp.zeros((b, t, h, d), jnp.float32)
    lse_acc = jnp.full((b, h, t), -jnp.inf, jnp.float32)
    kv = (k, v, kv_seg)
    for step in range(n):
        # Issue the next block's transfer first: it does not depend on this step's compute.
        nxt = lax.ppermute(kv, axis, perm) if step < n - 1 else None
        src = (me - step) % n
        if window is None:
            out, lse = _fwd_block(kernel, step, src, me, q, kv[0], kv[1], q_seg, kv[2], causal, zigzag, scale)
        else:  # a sliding-window layer: XLA blocks on global positions, pairs outside the window skipped
            out, lse = window_fwd_block(q, kv[0], kv[1], q_seg, kv[2], me, src, n=n, zigzag=zigzag, window=window,
                                        scale=scale)
        out_acc, lse_acc = merge_partial(out_acc, lse_acc, out, lse)
        kv = nxt
    return out_acc.astype(q.dtype), lse_acc


def _ring_backward(q, k, v, out, lse, dout, q_seg, kv_seg, *, axis, n, kernel, causal, zigzag, scale, window):
    me = lax.axis_index(axis) if n > 1 else 0
    perm = _ring_perm(n)
    dq = jnp.zeros(q.shape, jnp.float32)
    dkv = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    kv = (k, v, kv_seg)
    for step in range(n):
        nxt = lax.ppermute(kv, axis, perm) if step < n - 1 else None
        src = (me - step) % n
        if window is None:
            dq_s, dk_s, dv_s = _bwd_block(kernel, step, src, me, q, kv[0], kv[1], out, lse, dout, q_seg, kv[2],
                                          causal, zigzag, scale)
        else:
            dq_s, dk_s, dv_s = window_bwd_block(q, kv[0], kv[1], out, lse, dout, q_seg, kv[2], me, src, n=n,
                                                zigzag=zigzag, window=window, scale=scale)
        dq = dq + dq_s
        # The accumulators travel with their key block; after n hops they are back on the owner.
        dkv = (dkv[0] + dk_s, dkv[1] + dv_s)
        if n > 1:
            dkv = lax.ppermute(dkv, axis, perm)
        kv = nxt
    return dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _ring(q, k, v, q_seg, kv_seg, cfg):
    return _ring_forward(q, k, v, q_seg, kv_seg, **cfg.kwargs())[0]


def _ring_fwd(q, k, v, q_seg, kv_seg, cfg):
    out, lse = _ring_forward(q, k, v, q_seg, kv_seg, **cfg.kwargs())
    # Named as the single-device kernels name theirs (ops.kernel_vjp), so that the ``save_attention_out`` remat
    # policy keeps this device's out and LSE and the backward does not re-run the ring's forward. Every
    # multi-device mesh runs the Pallas kernels through here (a ring of one without a seq axis): unnamed, a
    # 4-GPU data-parallel step ran each layer's attention forward twice (H200 profile, issue 40).
    out, lse = checkpoint_name(out, ATTENTION_OUT_NAME), checkpoint_name(lse, ATTENTION_LSE_NAME)
    return out, (q, k, v, out, lse, q_seg, kv_seg)


def _ring_bwd(cfg, res, dout):
    kernel = cfg.kwargs()["kernel"]
    if not getattr(kernel, "supports_ring_backward", True):
        raise NotImplementedError(
            f"ring attention backward with {getattr(kernel, 'name', kernel)!r} blocks is not supported "
            "(forward works); use impl='pallas' or 'xla' for training")
    q, k, v, out, lse, q_seg, kv_seg = res
    dq, dk, dv = _ring_backward(q, k, v, out, lse, dout, q_seg, kv_seg, **cfg.kwargs())
    return dq, dk, dv, None, None


_ring.defvjp(_ring_fwd, _ring_bwd)


class _RingConfig:
    """Static ring settings (hashable, so it can be a custom_vjp non-differentiable argument)."""

    def __init__(self, axis, n, kernel, causal, zigzag, scale, window=None):
        self._items = (axis, n, kernel, bool(causal), bool(zigzag), float(scale), window)

    def kwargs(self):
        axis, n, kernel, causal, zigzag, scale, window = self._items
        return dict(axis=axis, n=n, kernel=kernel, causal=causal, zigzag=zigzag, scale=scale, window=window)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, _RingConfig) and self._items == other._items


# ------------------------------------------------------------------------------------------ public API


def ring_attention(q, k, v, *, mesh=None, axis="seq", segment_ids=None, causal=True, zigzag=True,
                   impl="auto", scale=None, interpret=False, window=None):
    """Attention with the sequence split over mesh axis ``axis``; same math as ``ops.attention``.

    q [B, T, Hq, D], k/v [B, T, Hkv, D], segment_ids [B, T] are *global* arrays (under ``jit``, typically
    sharded [batch, seq, heads, -]); with ``zigzag=True`` (default) their tokens must already be in
    zigzag order (``parallel.zigzag.zigzag_reorder``) and the result is too. A mesh without ``axis`` (or
    with it of size 1) runs the kernel once per batch/head shard. Batch is split over the ``data``/``fsdp`` axes
    and heads over ``tensor`` where they divide evenly (otherwise replicated on those axes). ``mesh=None``
    uses the mesh set by ``jax.set_mesh``. ``impl`` picks the per-block kernel: ``auto`` (the fastest
    single-device kernel, as ``ops.attention``), ``xla``, ``pallas`` (on Hopper+: tokamax Mosaic forward
    blocks, cuDNN backward blocks from the global out/LSE), ``pallas-mosaic``, ``pallas-triton``, or
    ``cudnn`` (its blocks' backward needs JAX's private cuDNN API, see ``ops.cudnn_flash``), or ``splash``
    (TPU; the default there; ``interpret=True`` runs its blocks in the Pallas interpreter on any backend).
    ``window`` (causal only): a sliding window, on ``xla`` blocks only (``ops.ring_window``: the block pairs
    outside the window are skipped); other block kernels refuse it.
    """
    check_shapes(q, k, v)
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh is None or mesh.empty:
            raise ValueError("ring_attention needs a mesh: pass mesh= or call it under jax.set_mesh(mesh)")
    b, t, hq, d = q.shape
    if k.shape[1] != t:
        raise ValueError(f"ring attention needs as many keys as queries (got T={t}, S={k.shape[1]})")
    # No (or a size-1) sequence axis: a ring of one, i.e. the kernel run per batch/head shard. This is how
    # kernels the compiler cannot partition (Pallas custom calls) run under data/fsdp/tensor meshes.
    n = int(mesh.shape[axis]) if axis in mesh.axis_names else 1
    seq_axis = axis if n > 1 else None
    parts = 2 * n if zigzag and n > 1 else n
    if t % parts:
        raise ValueError(f"sequence length {t} must be divisible by {parts} for {n} ring shards"
                         f"{' (zigzag)' if zigzag else ''}")
    if window is not None:
        if not causal or impl not in ("auto", "ring", "xla"):
            raise AttentionNotSupportedError(f"ring attention with a sliding window (window={window}) runs XLA "
                                             f"blocks on causal attention only (got impl={impl!r}, causal={causal})")
        impl = "xla"  # global positions across devices: XLA blocks (splash's LocalMask is one block's)
    if impl in ("auto", "ring"):
        impl = local_impl("auto", has_segment_ids=segment_ids is not None, dtype=q.dtype, window=window)
        if impl == "cudnn":
            if not cudnn_flash.available():  # no cuDNN backward from global statistics: train with xla
                impl = "xla"
    kernel = block_kernel(impl, has_segment_ids=segment_ids is not None, interpret=interpret, dtype=q.dtype)
    scale = d**-0.5 if scale is None else float(scale)

    batch = divisible_axes(mesh, BATCH_AXES, b, exclude=(axis,))
    heads = divisible_axes(mesh, (HEAD_AXIS,), math.gcd(hq, k.shape[2]), exclude=(axis,))
    qkv_spec = P(batch, seq_axis, heads, None)
    seg_spec = P(batch, seq_axis)
    cfg = _RingConfig(axis, n, kernel, causal, zigzag and n > 1, scale, None if window is None else int(window))

    if segment_ids is None:
        def per_device(q, k, v):
            return _ring(q, k, v, None, None, cfg)

        in_specs, args = (qkv_spec, qkv_spec, qkv_spec), (q, k, v)
    else:
        def per_device(q, k, v, seg):
            return _ring(q, k, v, seg, seg, cfg)

        in_specs, args = (qkv_spec, qkv_spec, qkv_spec, seg_spec), (q, k, v, segment_ids.astype(jnp.int32))
    fn = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=qkv_spec, check_vma=False)
    return fn(*args)
