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
Every off-diagonal step is thus half a block with no mask, run as two c x c calls (c = T/2n) whose chunk offsets
depend on ``src < me`` (``_zigzag_pairs``): the hidden half is never computed, every device runs the same kernels,
and the accumulators are updated in place. With segment ids (packed rows) each c x c call is cut further into
sub-blocks of about ``PACKED_SUB_BLOCK`` tokens a side, run in a loop per sub-block shape (``_over_sub_pairs``),
and a sub-block whose query and key segments never meet skips its kernel (``_unless_disjoint``): zigzag balances
one causal sequence, not the sequences of a packed row, and dense c x c calls over blocks that hold only a corner
of one sequence gave one GPU twice the kernel time of the other (docs/perf_training.md, "Packed rows over the
ring"). With ``zigzag=False`` (contiguous shards) blocks from later devices are skipped with ``lax.cond`` (the
device idles: contiguous causal rings are unbalanced, which is why zigzag is the default).

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


# ------------------------------------------------------------------------------------ half-block helpers


def _part(x, start, size, axis):
    """``size`` entries of ``x`` from ``start`` (a Python int or a traced scalar) along ``axis``; None stays None
    (absent segment ids)."""
    if x is None:
        return None
    if isinstance(start, int):
        return lax.slice_in_dim(x, start, start + size, axis=axis)
    return lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def _add_part(acc, start, part, axis):
    """``acc`` with ``part`` added to its entries from ``start`` along ``axis`` (an in-place update)."""
    return lax.dynamic_update_slice_in_dim(acc, _part(acc, start, part.shape[axis], axis) + part.astype(acc.dtype),
                                           start, axis)


def _zigzag_pairs(src, me, c):
    """The two (query start, key start) chunk pairs, each c x c, of a zigzag off-diagonal block.

    From an earlier device (src < me) both local query chunks see the first key chunk: (0, 0), (c, 0). From a
    later one the second query chunk sees both key chunks: (c, 0), (c, c). As two square calls whose offsets are
    data (no ``lax.cond``), every device runs the same kernels and updates its accumulators in place: a cond that
    passes the accumulators through its branches copies them (1 GiB of fp32 per block at 2 x 128K over 4 GPUs),
    and padding a half-size result to full size costs a full-size write and read."""
    earlier = src < me
    return (jnp.where(earlier, 0, c), 0), (c, jnp.where(earlier, 0, c))


# Side of the sub-blocks that packed rows' off-diagonal zigzag calls are cut into, so that a sub-block across
# sequences skips its kernel. Finer tracks the segments more closely but runs more kernels, each with its
# accumulator merge and a cond. 8K sides make a 20K-sequence row's step 26% shorter than whole blocks. Unrolled,
# every sub-block is a kernel instance of its own; run in a loop per shape (``_over_sub_pairs``), the shipped
# config's step compiles in 109 s against 70 s uncut (docs/perf_training.md, "Packed rows over the ring"). Cuts
# fall on multiples of SUB_BLOCK_ALIGN tokens (the kernels' largest tile), so a 32,000-token chunk (128,000-token
# rows over seq=2) becomes sides of 7,936 and 8,064.
PACKED_SUB_BLOCK = 8192
SUB_BLOCK_ALIGN = 128


def _cuts(c, sub):
    """(offset, size) of the parts a chunk of ``c`` tokens is cut into: about ``c / sub`` parts, each boundary on a
    multiple of SUB_BLOCK_ALIGN (``sub=None``, or a chunk that is not such a multiple: one part)."""
    parts = max(1, round(c / sub)) if sub else 1
    if parts == 1 or c % SUB_BLOCK_ALIGN:
        return [(0, c)]
    units = c // SUB_BLOCK_ALIGN
    edges = sorted({round(i * units / parts) * SUB_BLOCK_ALIGN for i in range(parts + 1)})
    return [(a, b - a) for a, b in zip(edges, edges[1:])]


def _sub_pairs(pairs, c, sub):
    """The (query start, query size, key start, key size) calls of ``pairs`` (c x c each) cut by ``_cuts``."""
    cuts = _cuts(c, sub)
    return [(qs + qo, qn, ks + ko, kn) for qs, ks in pairs for qo, qn in cuts for ko, kn in cuts]


def _id_range(seg):
    """Per row, the smallest and largest non-padding id of ``seg`` [B, c] (lo > hi for a row of padding only)."""
    lo = jnp.where(seg > 0, seg, jnp.iinfo(jnp.int32).max).min(axis=1)
    return lo, seg.max(axis=1)


def segments_meet(q_seg, kv_seg):
    """Whether a query of ``q_seg`` [B, c] may share a segment with a key of ``kv_seg`` [B, c']: in some row the two
    ranges of non-padding ids overlap, or both blocks hold padding (0, which attends to padding). Exact for a
    packed row, whose segments are contiguous runs numbered along it (a shared range then holds a shared id), and
    never false when an id is shared: a block it calls disjoint has nothing to compute under the segment mask.
    Padding is kept out of the ranges: it ends the row, so a block holding it would otherwise range from 0 up and
    meet every earlier block (the last zigzag chunk's device then ran every sub-block: docs/perf_training.md,
    "Packed rows over the ring")."""
    (q_lo, q_hi), (k_lo, k_hi) = _id_range(q_seg), _id_range(kv_seg)
    ids_meet = jnp.maximum(q_lo, k_lo) <= jnp.minimum(q_hi, k_hi)
    padding_meets = jnp.any(q_seg == 0, axis=1) & jnp.any(kv_seg == 0, axis=1)
    return jnp.any(ids_meet | padding_meets)


def _as_first_partial(out, lse):
    """A block's (out, lse) as the accumulators' starting value: fp32, zero where the block saw no key (what
    ``merge_partial`` into empty accumulators gives)."""
    seen = ~jnp.isneginf(lse).transpose(0, 2, 1)[..., None]
    return jnp.where(seen, out.astype(jnp.float32), 0.0), lse


# ------------------------------------------------------------------------------------ per-device ring


def _block_case(step, src, me, causal, zigzag):
    """Static kind of the block at ``step``: 'diag', 'full', or a traced choice (returned as None)."""
    if step == 0:
        return "diag" if causal else "full"
    if not causal:
        return "full"
    return None  # depends on src < me, known at run time


def _fwd_block(kernel, step, src, me, q, k, v, q_seg, kv_seg, causal, zigzag, scale, acc, sub_block=None):
    """The accumulators ``acc`` = (out fp32 [B,T,H,D], lse [B,H,T]) merged with the local queries' attention to the
    key block from device ``src`` (at step 0, ``acc`` is None: the block's own result starts them)."""

    def call(q_, k_, v_, qs, ks, c):
        return kernel.fwd(q_, k_, v_, q_segment_ids=qs, kv_segment_ids=ks, causal=c, scale=scale)

    case = _block_case(step, src, me, causal, zigzag)
    if case is not None:
        # own block (diag): kv segment ids are q's (passing the same array lets kernels know)
        part = call(q, k, v, q_seg, q_seg if case == "diag" else kv_seg, case == "diag")
        return _as_first_partial(*part) if acc is None else merge_partial(*acc, *part)

    if zigzag:
        def one(acc, qs, qn, ks, kn):
            args = (_part(q, qs, qn, 1), _part(k, ks, kn, 1), _part(v, ks, kn, 1), _part(q_seg, qs, qn, 1),
                    _part(kv_seg, ks, kn, 1))
            out, lse = _unless_disjoint(lambda a: call(*a, False), args, fills=(0.0, -jnp.inf))
            out_acc, lse_acc = acc
            out_h, lse_h = merge_partial(_part(out_acc, qs, qn, 1), _part(lse_acc, qs, qn, 2), out, lse)
            return (lax.dynamic_update_slice_in_dim(out_acc, out_h, qs, 1),
                    lax.dynamic_update_slice_in_dim(lse_acc, lse_h, qs, 2))

        return _over_sub_pairs(one, src, me, q.shape[1] // 2, q_seg, sub_block, acc)

    def earlier(acc):
        return merge_partial(*acc, *call(q, k, v, q_seg, kv_seg, False))

    def later(acc):  # contiguous shards: a block wholly in the future, nothing to compute
        return acc

    return lax.cond(src < me, earlier, later, acc)


def _bwd_block(kernel, step, src, me, q, k, v, out, lse, dout, q_seg, kv_seg, causal, zigzag, scale, grads,
               sub_block=None):
    """The fp32 accumulators ``grads`` = (dq, dk, dv) plus this key block's share, from the global out/lse."""

    def call(q_, k_, v_, o_, l_, do_, qs, ks, c):
        return kernel.bwd(q_, k_, v_, o_, l_, do_, q_segment_ids=qs, kv_segment_ids=ks, causal=c, scale=scale)

    def add_all(grads, parts):
        return tuple(a + g.astype(jnp.float32) for a, g in zip(grads, parts))

    case = _block_case(step, src, me, causal, zigzag)
    if case is not None:
        return add_all(grads, call(q, k, v, out, lse, dout, q_seg, q_seg if case == "diag" else kv_seg,
                                   case == "diag"))

    if zigzag:
        def one(grads, qs, qn, ks, kn):
            args = (_part(q, qs, qn, 1), _part(k, ks, kn, 1), _part(v, ks, kn, 1), _part(out, qs, qn, 1),
                    _part(lse, qs, qn, 2), _part(dout, qs, qn, 1), _part(q_seg, qs, qn, 1), _part(kv_seg, ks, kn, 1))
            dq_s, dk_s, dv_s = _unless_disjoint(lambda a: call(*a, False), args, fills=(0.0, 0.0, 0.0))
            dq, dk, dv = grads
            return _add_part(dq, qs, dq_s, 1), _add_part(dk, ks, dk_s, 1), _add_part(dv, ks, dv_s, 1)

        return _over_sub_pairs(one, src, me, q.shape[1] // 2, q_seg, sub_block, grads)

    def earlier(grads):
        return add_all(grads, call(q, k, v, out, lse, dout, q_seg, kv_seg, False))

    def later(grads):  # contiguous shards: nothing to compute
        return grads

    return lax.cond(src < me, earlier, later, grads)


def _over_sub_pairs(one, src, me, c, q_seg, sub_block, carry):
    """``carry`` through ``one(carry, q_start, q_size, k_start, k_size)`` for every call of a zigzag off-diagonal
    block from device ``src``: its two c x c calls as they are, or (segment ids: packed rows) cut into sub-blocks
    (``_sub_pairs``) and run as one ``fori_loop`` per sub-block shape. In a loop each shape's kernel is a single
    instance of the compiled program: unrolled, every sub-block was one of its own, and compiling Mosaic kernels
    set the price of finer cuts (the shipped step for h200x2, deviceless: 30, 90 and 330 kernels took 70, 161
    and 395 s)."""
    pairs = _zigzag_pairs(src, me, c)
    if q_seg is None:
        for qs, ks in pairs:
            carry = one(carry, qs, c, ks, c)
        return carry
    by_shape = {}
    for qs, qn, ks, kn in _sub_pairs(pairs, c, sub_block):
        by_shape.setdefault((qn, kn), []).append((qs, ks))
    for (qn, kn), starts in by_shape.items():
        q_starts = jnp.stack([jnp.asarray(qs, jnp.int32) for qs, _ in starts])
        k_starts = jnp.stack([jnp.asarray(ks, jnp.int32) for _, ks in starts])
        carry = lax.fori_loop(0, len(starts), lambda i, acc: one(acc, q_starts[i], qn, k_starts[i], kn), carry)
    return carry


def _unless_disjoint(compute, args, fills):
    """``compute(args)`` for a zigzag block, or its outputs filled with ``fills`` (a forward block that saw no key:
    out 0, LSE -inf, which merge_partial leaves the accumulators unchanged by; a backward one: zero gradients)
    when its query and key segment ids (the last two of ``args``) share no segment. Packed rows' blocks across
    sequences then cost a cond instead of a dense kernel over a masked block. Only the block's own result passes
    through the cond, never the accumulators (which a cond would copy)."""
    q_seg, kv_seg = args[-2:]
    if q_seg is None:
        return compute(args)
    shapes = jax.eval_shape(compute, args)

    def nothing(_):
        return tuple(jnp.full(x.shape, fill, x.dtype) for x, fill in zip(shapes, fills))

    return lax.cond(segments_meet(q_seg, kv_seg), compute, nothing, args)


def _ring_perm(n):
    return [(i, (i + 1) % n) for i in range(n)]  # at step s device r holds the block of device r - s


def _ring_forward(q, k, v, q_seg, kv_seg, *, axis, n, kernel, causal, zigzag, scale, window, sub_block):
    me = lax.axis_index(axis) if n > 1 else 0
    perm = _ring_perm(n)
    acc = None  # (out fp32, lse), started by step 0's block
    kv = (k, v, kv_seg)
    for step in range(n):
        # Issue the next block's transfer first: it does not depend on this step's compute.
        nxt = lax.ppermute(kv, axis, perm) if step < n - 1 else None
        src = (me - step) % n
        if window is None:
            acc = _fwd_block(kernel, step, src, me, q, kv[0], kv[1], q_seg, kv[2], causal, zigzag, scale, acc,
                             sub_block)
        else:  # a sliding-window layer: XLA blocks on global positions, pairs outside the window skipped
            part = window_fwd_block(q, kv[0], kv[1], q_seg, kv[2], me, src, n=n, zigzag=zigzag, window=window,
                                    scale=scale)
            acc = _as_first_partial(*part) if acc is None else merge_partial(*acc, *part)
        kv = nxt
    out_acc, lse_acc = acc
    return out_acc.astype(q.dtype), lse_acc


def _ring_backward(q, k, v, out, lse, dout, q_seg, kv_seg, *, axis, n, kernel, causal, zigzag, scale, window,
                   sub_block):
    me = lax.axis_index(axis) if n > 1 else 0
    perm = _ring_perm(n)
    dq = jnp.zeros(q.shape, jnp.float32)
    dk, dv = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
    kv = (k, v, kv_seg)
    for step in range(n):
        nxt = lax.ppermute(kv, axis, perm) if step < n - 1 else None
        src = (me - step) % n
        if window is None:
            dq, dk, dv = _bwd_block(kernel, step, src, me, q, kv[0], kv[1], out, lse, dout, q_seg, kv[2],
                                    causal, zigzag, scale, (dq, dk, dv), sub_block)
        else:
            parts = window_bwd_block(q, kv[0], kv[1], out, lse, dout, q_seg, kv[2], me, src, n=n,
                                     zigzag=zigzag, window=window, scale=scale)
            dq, dk, dv = (a + g.astype(jnp.float32) for a, g in zip((dq, dk, dv), parts))
        # The dk/dv accumulators travel with their key block; after n hops they are back on the owner.
        if n > 1:
            dk, dv = lax.ppermute((dk, dv), axis, perm)
        kv = nxt
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _ring(q, k, v, q_seg, kv_seg, cfg):
    return _ring_forward(q, k, v, q_seg, kv_seg, **cfg.kwargs())[0]


def _ring_fwd(q, k, v, q_seg, kv_seg, cfg):
    out, lse = _ring_forward(q, k, v, q_seg, kv_seg, **cfg.kwargs())
    # Named as the single-device kernels name theirs (ops.kernel_vjp), so that the ``save_attention_out`` remat
    # policy keeps this device's out and LSE and the backward does not re-run the ring's forward. Every
    # multi-device mesh runs the Pallas kernels through here (a ring of one without a seq axis): unnamed, a
    # 4-GPU data-parallel step ran each layer's attention forward twice (docs/perf_training.md).
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

    def __init__(self, axis, n, kernel, causal, zigzag, scale, window=None, sub_block=None):
        self._items = (axis, n, kernel, bool(causal), bool(zigzag), float(scale), window, sub_block)

    def kwargs(self):
        axis, n, kernel, causal, zigzag, scale, window, sub_block = self._items
        return dict(axis=axis, n=n, kernel=kernel, causal=causal, zigzag=zigzag, scale=scale, window=window,
                    sub_block=sub_block)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, _RingConfig) and self._items == other._items


# ------------------------------------------------------------------------------------------ public API


def _block_impl(impl: str, *, window, causal: bool, has_segment_ids: bool, dtype) -> str:
    """The kernel the ring runs per block for ``ring_attention``'s ``impl``: a window needs XLA blocks, and
    ``auto`` takes the fastest single-device kernel whose backward can run from the global statistics."""
    if window is not None:
        if not causal or impl not in ("auto", "ring", "xla"):
            raise AttentionNotSupportedError(f"ring attention with a sliding window (window={window}) runs XLA "
                                             f"blocks on causal attention only (got impl={impl!r}, causal={causal})")
        return "xla"  # global positions across devices: XLA blocks (splash's LocalMask is one block's)
    if impl in ("auto", "ring"):
        impl = local_impl("auto", has_segment_ids=has_segment_ids, dtype=dtype, window=window)
        if impl == "cudnn" and not cudnn_flash.available():  # no cuDNN backward from global statistics: xla
            return "xla"
    return impl


def ring_attention(q, k, v, *, mesh=None, axis="seq", segment_ids=None, causal=True, zigzag=True,
                   impl="auto", scale=None, interpret=False, window=None, sub_block="auto"):
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
    outside the window are skipped); other block kernels refuse it. ``sub_block``: with segment ids, the side of
    the sub-blocks (tokens) that off-diagonal zigzag calls are cut into so that those across sequences skip their
    kernel (None: whole c x c calls; "auto": ``PACKED_SUB_BLOCK``); without segment ids calls are never cut.
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
    impl = _block_impl(impl, window=window, causal=causal, has_segment_ids=segment_ids is not None, dtype=q.dtype)
    kernel = block_kernel(impl, has_segment_ids=segment_ids is not None, interpret=interpret, dtype=q.dtype)
    scale = d**-0.5 if scale is None else float(scale)

    batch = divisible_axes(mesh, BATCH_AXES, b, exclude=(axis,))
    heads = divisible_axes(mesh, (HEAD_AXIS,), math.gcd(hq, k.shape[2]), exclude=(axis,))
    qkv_spec = P(batch, seq_axis, heads, None)
    seg_spec = P(batch, seq_axis)
    sub_block = PACKED_SUB_BLOCK if sub_block == "auto" else sub_block
    cfg = _RingConfig(axis, n, kernel, causal, zigzag and n > 1, scale, None if window is None else int(window),
                      None if sub_block is None else int(sub_block))

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
