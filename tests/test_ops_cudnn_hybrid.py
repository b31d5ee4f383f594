"""The `pallas` hybrid (tokamax forward + cuDNN backward from given LSE), checked on CPU.

cuDNN cannot run here, so: the private-API plumbing is checked by abstract evaluation (argument order,
parameter names, output shapes), the dispatch and the ring wiring with a stand-in "cuDNN backward" (the
xla block backward, same contract: gradients from the given out and LSE), and the fallbacks. The real
kernels run in scripts/bench_attention.py on the lent GPUs.
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax.ops import cudnn_flash, cudnn_packed, dense_reference, dispatch, flash
from longrm_jax.ops.ring import ring_attention
from longrm_jax.ops.xla_attention import xla_attention_bwd
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.parallel.target import Target
from longrm_jax.parallel.zigzag import zigzag_reorder, zigzag_restore

B, T, HQ, HKV, D = 2, 64, 8, 2, 16


def _qkv(dtype=jnp.float32):
    kq, kk, kv, kw = jax.random.split(jax.random.key(3), 4)
    return (jax.random.normal(kq, (B, T, HQ, D), dtype), jax.random.normal(kk, (B, T, HKV, D), dtype),
            jax.random.normal(kv, (B, T, HKV, D), dtype), jax.random.normal(kw, (B, T, HQ, D), dtype))


def rel_err(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def test_private_cudnn_api_is_detected_on_this_jax():
    assert cudnn_flash.available(), cudnn_flash.UNAVAILABLE_REASON


def test_private_cudnn_calls_trace_with_the_expected_shapes():
    """Abstract evaluation runs JAX's own shape rules on our arguments: order and names must fit."""
    q = jax.ShapeDtypeStruct((2, 256, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 256, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((2, 8, 256), jnp.float32)
    out, stats = jax.eval_shape(lambda q, k, v: cudnn_flash.flash_forward(q, k, v, causal=True), q, kv, kv)
    assert (out.shape, out.dtype, stats.shape, stats.dtype) == (q.shape, q.dtype, lse.shape, jnp.float32)
    grads = jax.eval_shape(lambda *a: cudnn_flash.flash_backward(*a, causal=False, scale=0.1), q, kv, kv, q, lse, q)
    assert [(g.shape, g.dtype) for g in grads] == [(q.shape, q.dtype), (kv.shape, kv.dtype), (kv.shape, kv.dtype)]


def test_detection_reports_a_changed_signature(monkeypatch):
    monkeypatch.setattr(cudnn_flash, "_BWD_PARAMS", cudnn_flash._BWD_PARAMS[:-1])
    module, reason = cudnn_flash._detect()
    assert module is None and "expected" in reason


def test_supports_only_what_cudnn_computes_exactly():
    q, k, _, _ = _qkv(jnp.bfloat16)
    ok = dict(causal=True, has_segment_ids=False, check_device=False)
    assert cudnn_flash.supports(q, k, **ok)
    assert not cudnn_flash.supports(q, k, causal=True, has_segment_ids=False)  # CPU: no cuDNN
    assert not cudnn_flash.supports(q, k, **{**ok, "has_segment_ids": True})
    assert not cudnn_flash.supports(q.astype(jnp.float32), k.astype(jnp.float32), **ok)
    assert not cudnn_flash.supports(q[:, :32], k, **ok)  # causal with T != S: alignment differs
    assert cudnn_flash.supports(q[:, :32], k, **{**ok, "causal": False})
    assert not cudnn_flash.supports(q[..., :12], k[..., :12], **ok)  # head_dim not a multiple of 8


@pytest.fixture()
def fake_cudnn(monkeypatch):
    """cuDNN's backward replaced by the xla block backward (same contract), with a call counter."""
    flash._tokamax()  # as the library imports it (xprof stand-in included): never a skip, in any test order
    calls = []

    def backward(q, k, v, out, lse, dout, *, causal, scale):
        calls.append(causal)
        return xla_attention_bwd(q, k, v, out, lse, dout, causal=causal, scale=scale)

    monkeypatch.setattr(cudnn_flash, "flash_backward", backward)
    monkeypatch.setattr(cudnn_flash, "supports", lambda q, k, *, causal, has_segment_ids, **_: not has_segment_ids
                        and not (causal and q.shape[1] != k.shape[1]))
    # The ragged (packed) cuDNN backward stays off: it is faked in tests/test_ops_cudnn_packed.py. Left to
    # cudnn_packed.supports, it would turn on wherever a cuDNN library is installed (a CUDA jax plugin) and
    # lower the real cuDNN primitive on the CPU.
    monkeypatch.setattr(cudnn_packed, "supports", lambda *_, **__: False)
    return calls


def _grads(kernel, q, k, v, w, seg=None, causal=True):
    def f(q, k, v):
        return kernel.attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, causal=causal)

    return jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2)))(q, k, v)


def _want(q, k, v, w, seg=None, causal=True):
    return jax.grad(lambda *a: jnp.sum(dense_reference(*a, segment_ids=seg, causal=causal) * w),
                    argnums=(0, 1, 2))(q, k, v)


@pytest.mark.parametrize("causal", [True, False])
def test_hybrid_backward_goes_to_cudnn_without_segments(fake_cudnn, causal):
    q, k, v, w = _qkv()
    for g, r in zip(_grads(flash.HybridKernel("xla"), q, k, v, w, causal=causal), _want(q, k, v, w, causal=causal)):
        assert rel_err(g, r) < 1e-5
    assert fake_cudnn == [causal]


def test_hybrid_keeps_tokamax_backward_with_segments(fake_cudnn):
    q, k, v, w = _qkv()
    seg = jnp.asarray(np.repeat([[1] * 20 + [2] * 30 + [0] * 14], B, 0))
    for g, r in zip(_grads(flash.HybridKernel("xla"), q, k, v, w, seg), _want(q, k, v, w, seg)):
        assert rel_err(g, r) < 1e-5
    assert fake_cudnn == []


def test_hybrid_falls_back_to_tokamax_when_the_private_api_is_missing(monkeypatch, caplog):
    flash._tokamax()  # as the library imports it (xprof stand-in included): never a skip, in any test order
    monkeypatch.setattr(cudnn_flash, "_FA", None)
    with caplog.at_level(logging.WARNING):
        kernel = flash.HybridKernel("xla")
    assert "unavailable" in caplog.text
    q, k, v, w = _qkv(jnp.bfloat16)  # a dtype cuDNN takes: only the missing API forces the fallback
    up = [x.astype(jnp.float32) for x in (q, k, v, w)]
    for g, r in zip(_grads(kernel, q, k, v, w), _want(*up)):
        assert rel_err(g.astype(jnp.float32), r) < 2e-2


def test_ring_backward_with_hybrid_blocks(fake_cudnn):
    """Ring attention drives the hybrid's cuDNN block backward with the global out/LSE (zigzag, GQA)."""
    q, k, v, w = _qkv()
    kernel = flash.HybridKernel("xla")
    kernel.supports_ring_backward = True  # the stand-in forward is exact per block; the backward is "cuDNN"
    n = 2
    with jax.set_mesh(make_mesh(data=2, fsdp=2, seq=n)):
        def ring(q, k, v):
            zz = [zigzag_reorder(x, n) for x in (q, k, v)]
            return zigzag_restore(ring_attention(*zz, impl=kernel), n)

        got = jax.jit(jax.grad(lambda *a: jnp.sum(ring(*a) * w), argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(got, _want(q, k, v, w)):
        assert rel_err(g, r) < 1e-5
    assert sorted(set(fake_cudnn)) == [False, True]  # the diagonal (causal) and half blocks (unmasked)


def test_auto_picks_the_fastest_fwd_bwd_kernel(monkeypatch):
    monkeypatch.setattr(dispatch, "target_of", lambda *a: Target("gpu", "NVIDIA H100", 9.0))
    monkeypatch.setattr(flash, "tokamax_available", lambda: True)
    monkeypatch.setattr(flash, "hybrid_available", lambda *a: True)
    assert dispatch.local_impl("auto") == "pallas"
    assert dispatch.local_impl("auto", has_segment_ids=True) == "pallas"
    monkeypatch.setattr(flash, "hybrid_available", lambda *a: False)  # tokamax alone loses fwd+bwd to cuDNN
    assert dispatch.local_impl("auto") == "cudnn"
    assert dispatch.local_impl("auto", has_segment_ids=True) == "pallas"
    monkeypatch.setattr(flash, "tokamax_available", lambda: False)
    assert dispatch.local_impl("auto", has_segment_ids=True) == "xla"
    assert dispatch.local_impl("pallas-mosaic") == "pallas-mosaic"


def test_private_cudnn_window_traces_and_refuses_a_non_causal_one():
    q = jax.ShapeDtypeStruct((1, 256, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((1, 8, 256), jnp.float32)
    out, _ = jax.eval_shape(lambda q, k, v: cudnn_flash.flash_forward(q, k, v, window=64), q, kv, kv)
    assert out.shape == q.shape
    grads = jax.eval_shape(lambda *a: cudnn_flash.flash_backward(*a, window=64), q, kv, kv, q, lse, q)
    assert [g.shape for g in grads] == [q.shape, kv.shape, kv.shape]
    # The window reaches the custom call as cuDNN's sliding_window_length (W keys: i - W < j <= i)
    assert cudnn_flash._common(q, True, None, 64)[1]["sliding_window_length"] == 64
    assert cudnn_flash._common(q, True, None, None)[1]["sliding_window_length"] is None
    with pytest.raises(ValueError, match="causal"):
        cudnn_flash.flash_forward(jnp.zeros((1, 8, 2, 8), jnp.bfloat16), *[jnp.zeros((1, 8, 2, 8), jnp.bfloat16)] * 2,
                                  causal=False, window=4)


def test_auto_picks_cudnn_for_a_sliding_window_on_a_hopper_gpu(monkeypatch, caplog):
    """Gemma 3's local layers on a GPU: cuDNN (its sliding window skips the blocks outside it) for bf16 / fp16 rows
    without segment ids on compute capability >= 9.0; XLA's attention, reported as a slow path, otherwise."""
    from longrm_jax.ops import slow_paths

    hopper = Target("gpu", "NVIDIA H100", 9.0)
    monkeypatch.setattr(dispatch, "target_of", lambda *a: hopper)
    monkeypatch.setattr(flash, "hybrid_available", lambda *a: True)
    slow_paths.reset()
    assert flash.cudnn_window_available(hopper)
    assert dispatch.local_impl("auto", window=1024, dtype=jnp.bfloat16) == "cudnn"
    assert dispatch.local_impl("auto", window=1024) == "cudnn"
    assert dispatch.resolve_impl("auto", window=1024, dtype=jnp.bfloat16) == "cudnn"
    with caplog.at_level(logging.WARNING, logger="longrm_jax.ops.slow_paths"):
        assert dispatch.local_impl("auto", window=1024, has_segment_ids=True, dtype=jnp.bfloat16) == "xla"
        assert dispatch.local_impl("auto", window=1024, dtype=jnp.float32) == "xla"
    assert slow_paths.counts() == {"window_attention": 2}
    ampere = Target("gpu", "NVIDIA A100", 8.0)
    monkeypatch.setattr(dispatch, "target_of", lambda *a: ampere)
    assert not flash.cudnn_window_available(ampere)
    assert dispatch.local_impl("auto", window=1024, dtype=jnp.bfloat16) == "xla"
    monkeypatch.setattr(dispatch, "target_of", lambda *a: Target("tpu", "TPU v5", 0.0))
    assert dispatch.local_impl("auto", window=1024) == "splash"
    slow_paths.reset()


def test_auto_runs_fp32_attention_through_xla_on_a_gpu(monkeypatch, caplog):
    """The GPU flash kernels take bf16 / fp16 (tokamax's Mosaic kernel raised "Unsupported precision: F32_F32_F32"
    compiling a fp32 model for h100x8): ``auto`` picks XLA's attention for fp32 queries, warns once as a slow path
    naming model.compute_dtype, and keeps the kernels for bf16 and for the default (no dtype given)."""
    import jax.numpy as jnp

    from longrm_jax.ops import slow_paths

    monkeypatch.setattr(dispatch, "target_of", lambda *a: Target("gpu", "NVIDIA H100", 9.0))
    monkeypatch.setattr(flash, "tokamax_available", lambda: True)
    monkeypatch.setattr(flash, "hybrid_available", lambda *a: True)
    slow_paths.reset()
    with caplog.at_level(logging.WARNING, logger="longrm_jax.ops.slow_paths"):
        assert dispatch.local_impl("auto", dtype=jnp.float32) == "xla"
        assert dispatch.local_impl("auto", has_segment_ids=True, dtype=jnp.float32) == "xla"
    assert dispatch.local_impl("auto", dtype=jnp.bfloat16) == "pallas"
    assert dispatch.local_impl("auto", dtype=jnp.float16) == "pallas"
    assert dispatch.resolve_impl("auto", dtype=jnp.float32) == "xla"
    assert slow_paths.counts() == {"fp32_attention": 3}
    assert "model.compute_dtype=bfloat16" in caplog.text and caplog.text.count("fp32_attention") == 1
    slow_paths.reset()


def test_ring_with_cudnn_blocks(fake_cudnn, monkeypatch):
    """CudnnKernel as ring block kernel: fp32 statistics [B,H,T] from the forward, backward from global out/LSE."""
    from longrm_jax.ops.xla_attention import xla_attention_with_lse

    monkeypatch.setattr(cudnn_flash, "flash_forward", lambda q, k, v, *, causal, scale: xla_attention_with_lse(
        q, k, v, causal=causal, scale=scale))
    q, k, v, w = _qkv()
    kernel = flash.CudnnKernel()
    assert kernel.supports_ring_backward
    n = 4
    with jax.set_mesh(make_mesh(data=2, seq=n)):
        def ring(q, k, v):
            zz = [zigzag_reorder(x, n) for x in (q, k, v)]
            return zigzag_restore(ring_attention(*zz, impl=kernel), n)

        out, vjp = jax.vjp(jax.jit(ring), q, k, v)
        got = vjp(w)
    assert rel_err(out, dense_reference(q, k, v)) < 1e-5
    for g, r in zip(got, _want(q, k, v, w)):
        assert rel_err(g, r) < 1e-5
