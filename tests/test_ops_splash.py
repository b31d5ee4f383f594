"""TPU splash attention (``impl="splash"``) in the Pallas interpreter on CPU, against the XLA reference: outputs,
LSE and gradients (fp32, 1e-5 relative), as a single-device kernel, as ring-attention blocks on 4 and 8 fake
devices, and inside a tiny Qwen3 training step. The interpreter is slow: shapes stay at one or two blocks."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax import ops
from longrm_jax.ops import AttentionNotSupportedError, attention, attention_with_lse, dense_reference
from longrm_jax.ops.splash import block_sizes
from longrm_jax.ops.xla_attention import xla_attention_with_lse
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.parallel.zigzag import zigzag_reorder, zigzag_restore

B, D = 2, 16


@functools.cache
def _inputs(t, hq, hkv, dtype=jnp.float32):
    kq, kk, kv, kw = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(kq, (B, t, hq, D), dtype)
    k = jax.random.normal(kk, (B, t, hkv, D), dtype)
    v = jax.random.normal(kv, (B, t, hkv, D), dtype)
    w = jax.random.normal(kw, (B, t, hq, D), jnp.float32)  # cotangent weights for the gradient check
    seg = np.zeros((B, t), np.int32)
    seg[0, : t // 3], seg[0, t // 3: t - 9] = 1, 2  # two samples then padding
    seg[1, :7], seg[1, 7: t // 2], seg[1, t // 2:] = 1, 2, 3
    return q, k, v, w, jnp.asarray(seg)


def rel_err(a, b):
    return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)) / jnp.max(jnp.abs(b)))


def _outputs_and_grads(fn, q, k, v, w):
    """``fn``'s outputs and the gradients of ``sum(out * w)``, in one compiled program (the interpreter compiles
    slowly). ``fn`` returns ``out`` or ``(out, extra)``."""

    def loss(*args):
        outputs = fn(*args)
        out = outputs[0] if isinstance(outputs, tuple) else outputs
        return jnp.sum(out.astype(jnp.float32) * w), outputs

    (_, outputs), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return outputs, grads


def _reference(q, k, v, w, seg, causal):
    out = dense_reference(q, k, v, segment_ids=seg, causal=causal)
    grads = jax.grad(lambda *a: jnp.sum(dense_reference(*a, segment_ids=seg, causal=causal) * w),
                     argnums=(0, 1, 2))(q, k, v)
    return out, grads


# T=200 is not a block multiple: exercises the padding (causal: pad keys in the future; else masked by id).
@pytest.mark.parametrize("t,hq,hkv,causal,with_segments", [
    (256, 8, 2, True, True),    # GQA 4:1, several segments per row, two blocks
    (128, 2, 2, True, False),   # 1:1, plain causal
    (200, 4, 1, False, True),   # non-causal, padded
    (200, 2, 2, False, False),  # non-causal, padded keys masked without any segment ids of the caller
])
def test_splash_matches_reference(t, hq, hkv, causal, with_segments):
    q, k, v, w, seg = _inputs(t, hq, hkv)
    seg = seg if with_segments else None
    splash = functools.partial(attention_with_lse, segment_ids=seg, causal=causal, impl="splash", interpret=True)
    (out, lse), grads = _outputs_and_grads(splash, q, k, v, w)
    ref_out, ref_grads = _reference(q, k, v, w, seg, causal)
    assert rel_err(out, ref_out) < 1e-5
    for got, want in zip(grads, ref_grads):
        assert rel_err(got, want) < 1e-5
    _, ref_lse = xla_attention_with_lse(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, causal=causal)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_splash_bf16_as_on_tpu():
    q, k, v, w, seg = _inputs(128, 4, 1, jnp.bfloat16)
    splash = functools.partial(attention, segment_ids=seg, impl="splash", interpret=True)
    out, grads = _outputs_and_grads(splash, q, k, v, w)
    assert out.dtype == jnp.bfloat16
    ref_out, ref_grads = _reference(*(x.astype(jnp.float32) for x in (q, k, v)), w, seg, True)
    assert rel_err(out, ref_out) < 2e-2  # bf16 inputs (q scaled in bf16), fp32 accumulation
    for got, want in zip(grads, ref_grads):
        assert got.dtype == jnp.bfloat16 and rel_err(got, want) < 3e-2


def test_block_sizes_follow_length_and_head_dim():
    assert (block_sizes(32768, 32768, 128).block_q, block_sizes(32768, 32768, 128).block_kv) == (512, 512)
    assert block_sizes(32768, 32768, 256).block_q == 256  # larger heads: smaller tiles
    assert block_sizes(200, 64, 64).block_q == 256 and block_sizes(200, 64, 64).block_kv == 128
    # The padding stays under 128 tokens: a length of 600 runs 640 tokens in tiles of 128, not 1024 in 512s.
    assert [block_sizes(n, n, 128).block_q for n in (600, 1280, 1536)] == [128, 256, 512]


def test_splash_errors_are_clear():
    q, k, v, _, _ = _inputs(128, 2, 2)
    with pytest.raises(AttentionNotSupportedError, match="needs a TPU"):
        attention(q, k, v, impl="splash")  # the CPU backend without the interpreter
    with pytest.raises(AttentionNotSupportedError, match="T == S"):
        attention(q, k[:, :64], v[:, :64], impl="splash", interpret=True)
    with pytest.raises(ValueError, match="interpret"):
        attention(q, k, v, impl="xla", interpret=True)


def _ring_check(n, zigzag):
    q, k, v, w, seg = _inputs(128, 4, 1)
    mesh = make_mesh(data=1, fsdp=8 // n, seq=n)
    order = (lambda x: zigzag_reorder(x, n)) if zigzag else (lambda x: x)
    undo = (lambda x: zigzag_restore(x, n)) if zigzag else (lambda x: x)

    def ring(q, k, v):
        return undo(ops.ring_attention(order(q), order(k), order(v), mesh=mesh, segment_ids=order(seg),
                                       zigzag=zigzag, impl="splash", interpret=True))

    out, grads = _outputs_and_grads(ring, q, k, v, w)
    ref_out, ref_grads = _reference(q, k, v, w, seg, True)
    assert rel_err(out, ref_out) < 1e-5
    for got, want in zip(grads, ref_grads):
        assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("zigzag", [True, False])
def test_ring_with_splash_blocks_on_4_devices(zigzag):
    _ring_check(4, zigzag)


@pytest.mark.slow  # 8 ring steps, each traced with both branches of its causal choice, in the interpreter
@pytest.mark.parametrize("zigzag", [True, False])
def test_ring_with_splash_blocks_on_8_devices(zigzag):
    _ring_check(8, zigzag)


def test_auto_picks_splash_on_tpu(monkeypatch):
    from longrm_jax.ops import dispatch

    from longrm_jax.parallel.target import Target

    monkeypatch.setattr(dispatch, "target_of", lambda *a: Target("tpu", "TPU v5"))
    assert dispatch.local_impl("auto") == "splash"
    assert dispatch.local_impl("auto", has_segment_ids=True) == "splash"


@pytest.mark.slow  # compiles a tiny Qwen3 train step twice, once through the interpreter
def test_training_step_with_splash_equals_xla():
    from longrm_jax.train import DEFAULT_CONFIG
    from longrm_jax.training import batches as batch_lib
    from longrm_jax.training.config import load_config
    from helpers.batches import train_batches
    from longrm_jax.training.data_source import load_tokenizer
    from longrm_jax.training.model_setup import init_random, preset_config, with_training_numerics
    from longrm_jax.training.state import create_state, lr_schedule, make_optimizer
    from longrm_jax.training.steps import StageSpec, jit_train_step, make_train_step

    cfg = load_config(None, ["stage=sft", "data.seq_len=128", "data.batch_rows=2", "data.synthetic.lengths=[24,40]",
                             "data.num_train=4", "optim.lr=1e-2", "optim.warmup_ratio=0",
                             "optim.eps=1e-3"],  # eps: Adam steps on gradients of ~0 would compare rounding noise
                      base=DEFAULT_CONFIG)
    tok = load_tokenizer(cfg.data)
    host = batch_lib.prepare(dict(train_batches(cfg, tok)[0]))
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    base = with_training_numerics(preset_config(cfg, tok), cfg)
    assert base.family == "qwen3"

    def one_step(impl, interpret):
        mcfg = dataclasses.replace(base, attention_impl=impl, attention_interpret=interpret)
        codec, values = init_random(mcfg, mesh, cfg.seed)
        tx = make_optimizer(cfg.optim, 10)
        state, sh = create_state(cfg, codec, values, tx, mesh, jax.random.key(1))
        step = jit_train_step(make_train_step(cfg, codec, tx, StageSpec("sft", 0, 1), lr_schedule(cfg.optim, 10)), sh,
                              batch_lib.batch_shardings(mesh))
        with jax.set_mesh(mesh):
            state, metrics = step(state, batch_lib.to_global(host, mesh))
        return jax.device_get(metrics), jax.device_get(state.params)

    m_xla, p_xla = one_step("xla", False)
    m_splash, p_splash = one_step("splash", True)
    assert np.isfinite(m_xla["loss"])
    np.testing.assert_allclose(m_splash["loss"], m_xla["loss"], rtol=1e-5)
    np.testing.assert_allclose(m_splash["grad_norm"], m_xla["grad_norm"], rtol=1e-4)
    for key in p_xla:
        np.testing.assert_allclose(p_splash[key], p_xla[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_a_changed_private_backward_is_reported(monkeypatch):
    from longrm_jax.ops import splash

    splash._private_backward.cache_clear()
    monkeypatch.setattr(splash, "_BWD_PARAMS", splash._BWD_PARAMS[:-1])
    try:
        with pytest.raises(AttentionNotSupportedError, match="_splash_attention_bwd"):
            splash._private_backward()
    finally:
        splash._private_backward.cache_clear()
