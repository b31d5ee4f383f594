"""Ring attention on 8 fake CPU devices against the single-device dense reference (fp32, 1e-5 relative)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from longrm_jax import ops
from longrm_jax.ops import dense_reference
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.ops.ring import ring_attention
from longrm_jax.parallel.zigzag import (
    zigzag_inverse_permutation,
    zigzag_permutation,
    zigzag_reorder,
    zigzag_restore,
)

B, T, HQ, HKV, D = 2, 128, 8, 2, 16  # GQA 4:1


@functools.cache
def _inputs():
    kq, kk, kv, kw = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(kq, (B, T, HQ, D))
    k = jax.random.normal(kk, (B, T, HKV, D))
    v = jax.random.normal(kv, (B, T, HKV, D))
    w = jax.random.normal(kw, (B, T, HQ, D))  # cotangent weights for the gradient check
    seg = np.zeros((B, T), np.int32)
    seg[0, :40], seg[0, 40:110] = 1, 2  # two samples then padding
    seg[1, :7], seg[1, 7:64], seg[1, 64:] = 1, 2, 3
    return q, k, v, w, jnp.asarray(seg)


@functools.cache
def _reference(causal, with_segments):
    q, k, v, w, seg = _inputs()
    s = seg if with_segments else None

    def f(q, k, v):
        return dense_reference(q, k, v, segment_ids=s, causal=causal)

    return f(q, k, v), jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2))(q, k, v)


def rel_err(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def _check_ring(mesh_sizes, zigzag, causal, with_segments, via_ops=False):
    mesh = make_mesh(**mesh_sizes)
    n = mesh.shape["seq"]
    q, k, v, w, seg = _inputs()
    order = (lambda x: zigzag_reorder(x, n)) if zigzag else (lambda x: x)
    undo = (lambda x: zigzag_restore(x, n)) if zigzag else (lambda x: x)
    seg_in = order(seg) if with_segments else None

    def ring(q, k, v):
        if via_ops:  # the model's path: impl="auto" picks ring from the mesh
            return ops.attention(q, k, v, segment_ids=seg_in, causal=causal)
        return ring_attention(q, k, v, segment_ids=seg_in, causal=causal, zigzag=zigzag)

    def step(q, k, v, w):
        out, vjp = jax.vjp(ring, q, k, v)
        return out, vjp(w)

    with jax.set_mesh(mesh):
        # Batch over data x fsdp when it divides (else replicated: ring_attention must cope with both).
        batch = ("data", "fsdp") if B % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0 else None
        shard = NamedSharding(mesh, P(batch, "seq", "tensor", None))
        args = [jax.device_put(order(x), shard) for x in (q, k, v, w)]
        out, grads = jax.jit(step)(*args)
    want_out, want_grads = _reference(causal, with_segments)
    assert rel_err(undo(out), want_out) < 1e-5
    for name, g, r in zip("qkv", grads, want_grads):
        assert rel_err(undo(g), r) < 1e-5, f"d{name}"


@pytest.mark.parametrize(
    "mesh_sizes, zigzag, causal, with_segments",
    [
        (dict(data=1, fsdp=1, seq=8), True, True, True),
        (dict(data=1, fsdp=1, seq=8), False, True, False),
        (dict(data=2, fsdp=1, seq=4), True, True, False),
        (dict(data=2, fsdp=1, seq=4), False, True, True),
        (dict(data=1, fsdp=4, seq=2), True, False, True),  # batch 2 does not divide fsdp 4
        (dict(data=1, fsdp=2, seq=2, tensor=2), True, True, True),
        (dict(data=1, fsdp=2, seq=2, tensor=2), False, False, False),
    ],
)
def test_ring_matches_reference(mesh_sizes, zigzag, causal, with_segments):
    _check_ring(mesh_sizes, zigzag, causal, with_segments)


def test_ops_attention_auto_uses_ring_under_seq_mesh():
    mesh = make_mesh(data=2, fsdp=1, seq=4)
    with jax.set_mesh(mesh):
        assert ops.resolve_impl("auto") == "ring"
    _check_ring(dict(data=2, fsdp=1, seq=4), True, True, True, via_ops=True)


def test_zigzag_permutation_layout():
    perm = zigzag_permutation(16, 2)  # 4 chunks of 4: shard 0 gets chunks 0, 3; shard 1 chunks 1, 2
    np.testing.assert_array_equal(perm, [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11])
    x = np.arange(32).reshape(2, 16)
    np.testing.assert_array_equal(zigzag_restore(zigzag_reorder(x, 2), 2), x)
    np.testing.assert_array_equal(perm[zigzag_inverse_permutation(16, 2)], np.arange(16))
    assert isinstance(zigzag_reorder(x, 2), np.ndarray)
    with pytest.raises(ValueError, match="divisible"):
        zigzag_permutation(12, 4)


def test_ring_errors():
    q, k, v, _, _ = _inputs()
    with pytest.raises(ValueError, match="needs a mesh"):
        ring_attention(q, k, v)
    with jax.set_mesh(make_mesh(data=1, fsdp=1, seq=8)):
        with pytest.raises(ValueError, match="divisible by 16"):
            ring_attention(q[:, :120], k[:, :120], v[:, :120])


def test_ring_of_one_without_seq_axis():
    """A mesh without a seq axis runs the kernel per batch/head shard (how Pallas kernels run under fsdp)."""
    from jax.sharding import AxisType

    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
    q, k, v, w, seg = _inputs()
    with jax.set_mesh(mesh):
        out = jax.jit(lambda q, k, v: ring_attention(q, k, v, segment_ids=seg))(q, k, v)
    want, _ = _reference(True, True)
    assert rel_err(out, want) < 1e-5


class _CountingKernel:
    """XLA blocks that count the forward and backward calls actually run (a callback fires only in the branch a
    lax.cond takes)."""

    name = "counting-xla"
    supports_ring_backward = True

    def __init__(self):
        self.calls = {"fwd": 0, "bwd": 0}

    def _count(self, kind):
        jax.debug.callback(lambda: self.calls.__setitem__(kind, self.calls[kind] + 1))

    def fwd(self, q, k, v, **kw):
        from longrm_jax.ops.xla_attention import XlaBlockKernel

        self._count("fwd")
        return XlaBlockKernel.fwd(q, k, v, **kw)

    def bwd(self, *args, **kw):
        from longrm_jax.ops.xla_attention import XlaBlockKernel

        self._count("bwd")
        return XlaBlockKernel.bwd(*args, **kw)


def _run_counted_ring(seg, n, kernel, **ring_kwargs):
    """Output and (q, k, v) gradients of a zigzag ring over ``seg`` [1, t] with ``kernel``, beside the dense
    reference's."""
    t = seg.shape[1]
    kq, kk, kv, kw = jax.random.split(jax.random.key(1), 4)
    q, w = jax.random.normal(kq, (1, t, HQ, D)), jax.random.normal(kw, (1, t, HQ, D))
    k, v = jax.random.normal(kk, (1, t, HKV, D)), jax.random.normal(kv, (1, t, HKV, D))

    def loss(f, q, k, v):
        return jnp.sum(f(q, k, v) * w)

    ring = lambda q, k, v: zigzag_restore(  # noqa: E731
        ring_attention(zigzag_reorder(q, n), zigzag_reorder(k, n), zigzag_reorder(v, n),
                       segment_ids=zigzag_reorder(seg, n), impl=kernel, **ring_kwargs), n)
    with jax.set_mesh(make_mesh(data=1, fsdp=-1, seq=n)):
        out = jax.jit(ring)(q, k, v)
        jax.block_until_ready(out)
        fwd_calls = kernel.calls["fwd"]
        grads = jax.jit(jax.grad(functools.partial(loss, ring), argnums=(0, 1, 2)))(q, k, v)
        jax.block_until_ready(grads)
    ref = lambda q, k, v: dense_reference(q, k, v, segment_ids=seg, causal=True)  # noqa: E731
    ref_grads = jax.grad(functools.partial(loss, ref), argnums=(0, 1, 2))(q, k, v)
    return fwd_calls, (out, grads), (ref(q, k, v), ref_grads)


def test_packed_sub_blocks_skip_the_parts_of_a_zigzag_block_across_sequences(monkeypatch):
    """Sequences of 40, 40 and 44 tokens then 4 of padding in a row of 128 over seq=4 (zigzag chunks of 16),
    sub-blocks of 8: a c x c call that holds a sequence boundary runs only its sub-blocks within one sequence, and
    padding meets only padding (the padded last chunk used to meet every block). The expected count is enumerated
    here on global positions: device r holds chunks r and 7 - r; from an earlier device both its chunks see the
    sender's first chunk, from a later one its second chunk sees both of the sender's."""
    from longrm_jax.ops import ring

    monkeypatch.setattr(ring, "SUB_BLOCK_ALIGN", 8)  # the kernels' tile (128) would leave chunks of 16 uncut
    n, c, sub = 4, 16, 8
    ids = np.repeat([1, 2, 3, 0], [40, 40, 44, 4])

    def meets(qc, kc, i, j):  # sub-block i of query chunk qc against sub-block j of key chunk kc
        qa, ka = qc * c + i * sub, kc * c + j * sub
        return bool(set(ids[qa:qa + sub]) & set(ids[ka:ka + sub]))

    expected = n  # the own-device (causal) calls are never cut
    for me in range(n):
        for src in set(range(n)) - {me}:
            pairs = [(me, src), (2 * n - 1 - me, src)] if src < me else [(2 * n - 1 - me, src),
                                                                         (2 * n - 1 - me, 2 * n - 1 - src)]
            expected += sum(meets(qc, kc, i, j) for qc, kc in pairs for i in range(2) for j in range(2))
    kernel = _CountingKernel()
    calls, (out, grads), (ref_out, ref_grads) = _run_counted_ring(jnp.asarray(ids[None], jnp.int32), n, kernel,
                                                                   sub_block=sub)
    rings = len(jax.devices()) // n
    assert calls == rings * expected, (calls, expected)  # 20 sub-blocks, where 8 whole calls would be 32
    assert rel_err(out, ref_out) < 1e-5
    for name, g, r in zip("qkv", grads, ref_grads):
        assert rel_err(g, r) < 1e-5, f"d{name}"
    # The sub-blocks run in a loop: the compiled forward holds one kernel instance for the own block and one per
    # ring step (its sub-blocks are of one shape), not one per sub-block (1 + 3 x 8), which compiling paid for.
    seg = zigzag_reorder(jnp.asarray(ids[None], jnp.int32), n)
    x = jnp.zeros((1, 4 * 2 * c, HQ, D))
    with jax.set_mesh(make_mesh(data=1, fsdp=-1, seq=n)):
        text = jax.jit(lambda q: ring_attention(q, q[:, :, :HKV], q[:, :, :HKV], segment_ids=seg, impl=kernel,
                                                sub_block=sub)).lower(x).as_text()
    assert text.count("custom_call @xla_ffi_python_cpu_callback") == 1 + (n - 1)


def test_zigzag_blocks_across_packed_sequences_are_skipped():
    """A packed row of 4 sequences of 32 tokens over seq=4 (8 zigzag chunks of 16, chunk j in sequence j // 2):
    of the 24 off-diagonal chunk pairs the ring visits, only the 4 inside one sequence (chunks 2i+1 against 2i)
    run a kernel; the others are disjoint and skipped. Output and gradients still equal the dense reference."""
    from longrm_jax.ops.ring import segments_meet

    n = 4
    seg = jnp.asarray(np.repeat(np.arange(1, 5), 32)[None, :], jnp.int32)
    kernel = _CountingKernel()
    calls, (out, grads), (ref_out, ref_grads) = _run_counted_ring(seg, n, kernel)
    rings = len(jax.devices()) // n  # the batch of 1 is replicated over the other devices: a ring each
    # 4 own-device blocks + the 4 within a sequence (not 4 + 24), on each device of each ring
    assert calls == rings * (n + 4), kernel.calls
    assert rel_err(out, ref_out) < 1e-5
    for name, g, r in zip("qkv", grads, ref_grads):
        assert rel_err(g, r) < 1e-5, f"d{name}"
    # the overlap test itself: ranges of ids per row, padding (0) a segment like any other
    s = lambda *rows: jnp.asarray(rows, jnp.int32)  # noqa: E731
    assert not bool(segments_meet(s([1, 1, 2]), s([3, 3, 4])))
    assert bool(segments_meet(s([1, 2, 2]), s([2, 3, 3])))
    assert bool(segments_meet(s([3, 0, 0]), s([1, 1, 0])))  # padding meets padding
    assert not bool(segments_meet(s([3, 0, 0]), s([1, 2, 2])))  # and nothing else: 0 is not the range's start
    assert bool(segments_meet(s([1, 1], [5, 5]), s([2, 2], [5, 6])))  # any row that meets runs the block
