"""Accelerator kernel wrappers, checked on CPU: mask translation, refusals, and tokamax's XLA stand-in.

The real Mosaic GPU / cuDNN kernels run in scripts/bench_attention.py on the lent GPUs; here tokamax's
reference op (same API, same ``Mask`` / residual conventions) stands in for them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax import ops
from longrm_jax.ops import AttentionNotSupportedError, dense_reference
from longrm_jax.ops.flash import CudnnKernel, segment_key_ranges
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.ops.ring import ring_attention
from longrm_jax.parallel.zigzag import zigzag_reorder, zigzag_restore

B, T, HQ, HKV, D = 2, 64, 8, 2, 16


def _qkv():
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(kq, (B, T, HQ, D)), jax.random.normal(kk, (B, T, HKV, D)),
            jax.random.normal(kv, (B, T, HKV, D)))


def _segments():
    seg = np.zeros((B, T), np.int32)
    seg[0, :20], seg[0, 20:50] = 1, 2
    seg[1, :5], seg[1, 5:64] = 1, 2
    return jnp.asarray(seg)


def rel_err(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def test_segment_key_ranges_match_the_segment_mask():
    q_seg = jnp.array([[1, 1, 2, 2, 2, 0, 3]])
    kv_seg = jnp.array([[1, 1, 2, 2, 2, 0, 0]])
    k_start, k_end, exact = segment_key_ranges(q_seg, kv_seg)
    np.testing.assert_array_equal(k_start, [[0, 0, 2, 2, 2, 5, 0]])
    np.testing.assert_array_equal(k_end, [[2, 2, 5, 5, 5, 7, 0]])  # segment 3 has no key: empty range
    assert bool(exact[0])
    _, _, exact = segment_key_ranges(jnp.array([[1, 2, 1]]), jnp.array([[1, 2, 1]]))
    assert not bool(exact[0])  # segment 1 is split: not expressible as one range


def test_unavailable_kernels_refuse_on_cpu():
    q, k, v = _qkv()
    for impl in ("cudnn", "pallas", "pallas-mosaic", "pallas-triton"):
        with pytest.raises(AttentionNotSupportedError):
            ops.attention(q, k, v, impl=impl)


def test_cudnn_refuses_segment_ids():
    q, k, v = _qkv()
    with pytest.raises(AttentionNotSupportedError, match="segment ids"):
        CudnnKernel().attention(q, k, v, q_segment_ids=_segments(), kv_segment_ids=_segments())
    with pytest.raises(AttentionNotSupportedError, match="segment ids"):
        CudnnKernel().bwd(q, k, v, q, None, q, q_segment_ids=_segments(), kv_segment_ids=_segments())


def test_cudnn_ring_backward_needs_the_private_api(monkeypatch):
    from longrm_jax.ops import cudnn_flash

    monkeypatch.setattr(cudnn_flash, "_FA", None)
    q, k, v = _qkv()
    kernel = CudnnKernel()
    assert not kernel.supports_ring_backward
    with pytest.raises(AttentionNotSupportedError, match="ring attention"):
        kernel.bwd(q, k, v, q, None, q)


@pytest.fixture(scope="module")
def stand_in():
    ops.flash._tokamax()  # as the library imports it (xprof stand-in included): never a skip, in any test order
    from longrm_jax.ops.flash import TokamaxKernel

    return TokamaxKernel("xla")


@pytest.mark.parametrize("causal, with_segments", [(True, True), (False, True), (True, False)])
def test_tokamax_wrapper_matches_reference(stand_in, causal, with_segments):
    q, k, v = _qkv()
    seg = _segments() if with_segments else None
    w = jnp.cos(q)

    def fast(q, k, v):
        return stand_in.attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, causal=causal)

    def ref(q, k, v):
        return dense_reference(q, k, v, segment_ids=seg, causal=causal)

    assert rel_err(jax.jit(fast)(q, k, v), ref(q, k, v)) < 1e-5
    lse = jax.jit(lambda q, k, v: stand_in.attention_with_lse(q, k, v, q_segment_ids=seg, kv_segment_ids=seg,
                                                              causal=causal)[1])(q, k, v)
    _, want_lse = ops.attention_with_lse(q, k, v, segment_ids=seg, causal=causal, impl="xla")
    assert rel_err(lse, want_lse) < 1e-5
    got = jax.jit(jax.grad(lambda *a: jnp.sum(fast(*a) * w), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(ref(*a) * w), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(got, want):
        assert rel_err(g, r) < 1e-5
    with pytest.raises(NotImplementedError, match="LSE"):
        jax.grad(lambda q: jnp.sum(stand_in.attention_with_lse(q, k, v, causal=causal)[1]))(q)


def test_tokamax_wrapper_poisons_non_contiguous_segments(stand_in):
    q, k, v = _qkv()
    seg = jnp.asarray(np.repeat([[1] * 20 + [2] * 30 + [1] * 14], B, 0))
    assert bool(jnp.isnan(stand_in.attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg)).all())


def test_ring_forward_with_tokamax_blocks(stand_in):
    """The ring drives the tokamax wrapper (k ranges in zigzag half-blocks, residual merge) correctly."""
    q, k, v = _qkv()
    seg = _segments()
    n = 2
    with jax.set_mesh(make_mesh(data=2, fsdp=2, seq=n)):
        def ring(q, k, v):
            zz = [zigzag_reorder(x, n) for x in (q, k, v)]
            return zigzag_restore(ring_attention(*zz, segment_ids=zigzag_reorder(seg, n), impl=stand_in), n)

        out = jax.jit(ring)(q, k, v)
        with pytest.raises(NotImplementedError, match="backward"):
            jax.grad(lambda q: jnp.sum(ring(q, k, v)))(q)
    assert rel_err(out, dense_reference(q, k, v, segment_ids=seg)) < 1e-5
