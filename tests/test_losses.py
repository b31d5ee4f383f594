"""Losses against the upstream formulas (docs/upstream.md, "Losses"), written out in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax import losses


def _log_sigmoid(x):
    return -np.log1p(np.exp(-x))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_simpo_matches_formula(label_smoothing):
    rng = np.random.default_rng(0)
    pc, pr = rng.normal(-1, 0.5, 6), rng.normal(-1.3, 0.5, 6)
    beta, gamma = 2.5, 0.5
    z = beta * (pc - pr) - gamma
    want = -(1 - label_smoothing) * _log_sigmoid(z) - label_smoothing * _log_sigmoid(-z)
    got = losses.simpo_loss(jnp.array(pc), jnp.array(pr), beta=beta, gamma=gamma, label_smoothing=label_smoothing)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_simpo_several_rejects_and_nll():
    rng = np.random.default_rng(1)
    pc, pr = rng.normal(-1, 0.5, 4), rng.normal(-1.3, 0.5, (4, 3))
    z = 2.0 * (pc - pr.mean(-1)) - 0.3
    want = -_log_sigmoid(z) + 0.7 * (-pc)
    got = losses.simpo_loss(jnp.array(pc), jnp.array(pr), beta=2.0, gamma=0.3, nll_weight=0.7)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_bradley_terry_margin_rejects_and_centering():
    rng = np.random.default_rng(2)
    rc, rr = rng.normal(size=5), rng.normal(size=(5, 2))
    want = -_log_sigmoid(rc - rr.mean(-1) - 0.25)
    np.testing.assert_allclose(losses.bradley_terry_loss(jnp.array(rc), jnp.array(rr), margin=0.25), want, rtol=1e-5)
    r1 = rr[:, 0]
    want = -_log_sigmoid(rc - r1) + 0.01 * (rc + r1) ** 2
    got = losses.bradley_terry_loss(jnp.array(rc), jnp.array(r1), center_rewards_coefficient=0.01)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="does not match"):
        losses.bradley_terry_loss(jnp.zeros(3), jnp.zeros(4))


def test_sft_loss_is_masked_nll():
    lp = jnp.array([[-1.0, -2.0, -3.0]])
    m = jnp.array([[0, 1, 1]])
    np.testing.assert_allclose(losses.sft_loss(lp, m), [[0.0, 2.0, 3.0]])


@pytest.mark.parametrize("t,chunk", [(12, 8), (7, 5), (16, 1000)])
def test_chunked_logprobs_match_dense_and_grads(t, chunk):
    rng = np.random.default_rng(3)
    b, d, v = 2, 8, 37
    h = jnp.array(rng.normal(size=(b, t, d)), jnp.float32)
    w = jnp.array(rng.normal(size=(d, v)) * 0.3, jnp.float32)
    y = jnp.array(rng.integers(0, v, (b, t)))
    y = y.at[0, -1].set(-1)  # padding target

    def dense(h, w):
        lp = jax.nn.log_softmax(h @ w, axis=-1)
        out = jnp.take_along_axis(lp, jnp.maximum(y, 0)[..., None], -1)[..., 0]
        return jnp.where(y >= 0, out, 0.0)

    def chunked(h, w):
        return losses.token_logprobs(h, w, y, chunk_tokens=chunk)

    np.testing.assert_allclose(chunked(h, w), dense(h, w), rtol=1e-5, atol=1e-6)
    g_dense = jax.grad(lambda h, w: dense(h, w).sum(), argnums=(0, 1))(h, w)
    g_chunk = jax.grad(lambda h, w: chunked(h, w).sum(), argnums=(0, 1))(h, w)
    for a, e in zip(g_chunk, g_dense):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


def test_segment_mean_and_last_values():
    seg = jnp.array([[1, 1, 1, 2, 2, 0]])
    lp = jnp.array([[-1.0, -2.0, -3.0, -4.0, -6.0, -9.0]])
    mask = jnp.array([[0, 1, 1, 1, 1, 0]])
    mean, count = losses.segment_mean_logprobs(lp, mask, seg, 3)
    np.testing.assert_allclose(mean, [[-2.5, -5.0, 0.0]])
    np.testing.assert_allclose(count, [[2, 2, 0]])
    last = jnp.array([[0, 0, 1, 0, 1, 0]])
    np.testing.assert_allclose(losses.segment_last_values(lp, last, seg, 2), [[-3.0, -6.0]])


def test_token_logprobs_skips_unneeded_chunks_exactly():
    """needed_bt: contiguous chunks without a needed token are skipped; needed tokens' log-probs and the
    gradients of a loss over them equal the dense computation."""
    k = jax.random.split(jax.random.key(0), 3)
    b, t, d, v = 2, 64, 16, 50
    h = jax.random.normal(k[0], (b, t, d))
    w = jax.random.normal(k[1], (d, v))
    y = jax.random.randint(k[2], (b, t), 0, v).at[:, -1].set(-1)
    need = jnp.zeros((b, t), bool).at[0, 40:50].set(True).at[1, 3:5].set(True)

    def loss(h, w, needed):
        return (losses.token_logprobs(h, w, y, chunk_tokens=8, needed_bt=needed) * need).sum()

    dense = jax.nn.log_softmax(h @ w)[jnp.arange(b)[:, None], jnp.arange(t)[None], jnp.clip(y, 0)]
    np.testing.assert_allclose(loss(h, w, need), (dense * need).sum(), rtol=1e-6)
    skipped = losses.token_logprobs(h, w, y, chunk_tokens=8, needed_bt=need)
    assert float(jnp.abs(skipped[0, :40]).max()) == 0.0  # chunks 0-4 of row 0 hold no needed token
    g_all = jax.grad(loss, argnums=(0, 1))(h, w, None)
    g_skip = jax.grad(loss, argnums=(0, 1))(h, w, need)
    for a, c in zip(g_all, g_skip):
        np.testing.assert_allclose(c, a, rtol=1e-5, atol=1e-6)
