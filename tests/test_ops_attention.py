"""ops.attention: the blockwise xla kernel against a naive dense fp32 reference, and the dispatcher."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax import ops
from longrm_jax.ops import attention, attention_with_lse, dense_reference
from longrm_jax.ops.xla_attention import xla_attention_bwd, xla_attention_with_lse


def _qkv(b=2, t=96, hq=4, hkv=2, d=16, s=None, seed=0, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    s = t if s is None else s
    return (jax.random.normal(kq, (b, t, hq, d), dtype), jax.random.normal(kk, (b, s, hkv, d), dtype),
            jax.random.normal(kv, (b, s, hkv, d), dtype))


def _packed_segments(b, t, seed=0):
    """Rows of 1..n segments of random lengths followed by padding (0)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(b):
        cuts = np.sort(rng.choice(np.arange(1, t - 4), size=3, replace=False))
        row = np.zeros(t, np.int32)
        row[: cuts[0]] = 1
        row[cuts[0]: cuts[1]] = 2
        row[cuts[1]: cuts[2]] = 3
        rows.append(row)
    return jnp.asarray(np.stack(rows))


def rel_err(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


@pytest.mark.parametrize(
    "causal, with_segments, heads",
    [(True, True, (8, 2)), (False, True, (4, 4)), (True, False, (4, 4)), (False, False, (8, 2))],
)
def test_xla_matches_dense_with_grads(causal, with_segments, heads):
    hq, hkv = heads
    q, k, v = _qkv(t=100, hq=hq, hkv=hkv)  # 100: not a multiple of the blocks -> padding path
    seg = _packed_segments(2, 100) if with_segments else None

    def fast(q, k, v):
        return xla_attention_with_lse(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, causal=causal,
                                      block_q=32, block_k=16)[0]

    def ref(q, k, v):
        return dense_reference(q, k, v, segment_ids=seg, causal=causal)

    out, want = jax.jit(fast)(q, k, v), ref(q, k, v)
    assert out.dtype == jnp.float32
    assert rel_err(out, want) < 1e-5
    w = jnp.cos(want)
    got_g = jax.jit(jax.grad(lambda *a: jnp.sum(fast(*a) * w), argnums=(0, 1, 2)))(q, k, v)
    want_g = jax.grad(lambda *a: jnp.sum(ref(*a) * w), argnums=(0, 1, 2))(q, k, v)
    for name, g, r in zip("qkv", got_g, want_g):
        assert rel_err(g, r) < 1e-5, name


def test_lse_value_and_gradient():
    q, k, v = _qkv(t=64, hq=4, hkv=1)
    out, lse = attention_with_lse(q, k, v, impl="xla")
    b, t, hq, d = q.shape
    logits = jnp.einsum("bthd,bshd->bhts", q, jnp.repeat(k, 4, axis=2), precision="highest") * d**-0.5
    logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -jnp.inf)
    want = jax.nn.logsumexp(logits, axis=-1)
    assert lse.shape == (b, hq, t) and lse.dtype == jnp.float32
    assert rel_err(lse, want) < 1e-5

    def via_lse(q, k, v):
        return jnp.sum(jnp.sin(attention_with_lse(q, k, v, impl="xla")[1]))

    def via_dense(q, k, v):
        lg = jnp.einsum("bthd,bshd->bhts", q, jnp.repeat(k, 4, axis=2), precision="highest") * d**-0.5
        return jnp.sum(jnp.sin(jax.nn.logsumexp(jnp.where(jnp.tril(jnp.ones((t, t), bool)), lg, -jnp.inf), -1)))

    for g, r in zip(jax.jit(jax.grad(via_lse, (0, 1)))(q, k, v), jax.grad(via_dense, (0, 1))(q, k, v)):
        assert rel_err(g, r) < 1e-5


def test_blockwise_backward_from_global_residuals_splits_exactly():
    """Two key halves' backward with the global out/lse sum to the full gradient (what ring attention uses)."""
    q, k, v = _qkv(t=64, hq=4, hkv=2)
    out, lse = xla_attention_with_lse(q, k, v, causal=False)
    dout = jnp.cos(out)
    full = xla_attention_bwd(q, k, v, out, lse, dout, causal=False)
    h = 32
    a = xla_attention_bwd(q, k[:, :h], v[:, :h], out, lse, dout, causal=False)
    b = xla_attention_bwd(q, k[:, h:], v[:, h:], out, lse, dout, causal=False)
    assert rel_err(a[0] + b[0], full[0]) < 1e-5
    assert rel_err(jnp.concatenate([a[1], b[1]], 1), full[1]) < 1e-5
    assert rel_err(jnp.concatenate([a[2], b[2]], 1), full[2]) < 1e-5


def test_cross_attention_lengths_and_bf16():
    q, k, v = _qkv(t=8, s=40, hq=4, hkv=2)
    want = dense_reference(q, k, v, causal=True)  # queries aligned to the end of the keys
    assert rel_err(attention(q, k, v, impl="xla"), want) < 1e-5
    qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
    out = attention(qb, kb, vb, impl="xla")
    assert out.dtype == jnp.bfloat16 and rel_err(out.astype(jnp.float32), want) < 2e-2


def test_fully_masked_rows_give_zero_and_neg_inf_lse():
    q, k, v = _qkv(t=16)
    q_seg = jnp.full((2, 16), 5, jnp.int32)
    kv_seg = jnp.ones((2, 16), jnp.int32)
    out, lse = attention_with_lse(q, k, v, segment_ids=(q_seg, kv_seg), impl="xla")
    assert jnp.all(out == 0) and jnp.all(jnp.isneginf(lse))


def test_auto_on_cpu_is_xla_and_matches_reference():
    q, k, v = _qkv(t=32)
    assert ops.resolve_impl("auto") == "xla"
    assert rel_err(attention(q, k, v), dense_reference(q, k, v)) < 1e-5
    assert jax.jit(lambda *a: attention(*a))(q, k, v).shape == q.shape


def test_unknown_impl_lists_valid_ones():
    q, k, v = _qkv(t=8)
    with pytest.raises(ValueError, match="valid: auto, xla, cudnn, pallas, pallas-mosaic, pallas-triton, splash, ring"):
        attention(q, k, v, impl="flash9")


def test_bad_shapes_raise():
    q, k, v = _qkv(t=8, hq=3, hkv=2)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        attention(q, k, v)
    q, k, v = _qkv(t=8, s=12)
    with pytest.raises(ValueError, match="T == S"):
        attention(q, k, v, segment_ids=jnp.ones((2, 8), jnp.int32))
