"""FP8 projections (model.matmul_dtype: fp8, ops.fp8_matmul): close to the compute-dtype model, gradients
included, and the compiled training program runs FP8 dots (float8_e4m3fn forward, float8_e5m2 gradients)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax.models.config import ModelConfig
from longrm_jax.models.layers import project
from longrm_jax.ops.fp8_matmul import fp8_projection


def _fp8_rounded(x):
    """Each row of ``x`` scaled by its own absolute maximum onto e4m3's range, rounded there, scaled back: the
    rounding the forward applies to an operand (current scaling, one scale per row)."""
    x = np.asarray(x, np.float32)
    scale = np.abs(x).max(axis=-1, keepdims=True) / 448.0
    return (x / scale).astype(jnp.float8_e4m3fn).astype(np.float32) * scale


def test_fp8_projection_is_the_product_of_the_rounded_operands():
    x = np.asarray(jax.random.normal(jax.random.key(0), (2, 8, 64)), np.float32)
    w = np.asarray(jax.random.normal(jax.random.key(1), (64, 32)), np.float32) * 0.1
    out = np.asarray(fp8_projection(jnp.asarray(x), jnp.asarray(w), 1))
    want = _fp8_rounded(x) @ _fp8_rounded(w.T).T  # the weight: one scale per output column
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    exact = x @ w
    assert np.abs(out - exact).max() / np.abs(exact).max() < 0.05  # e4m3: 3 mantissa bits, errors average out


def test_project_follows_matmul_dtype_and_contracts_two_axes():
    x = jax.random.normal(jax.random.key(2), (2, 8, 4, 16))
    w = jax.random.normal(jax.random.key(3), (4, 16, 64)) * 0.1
    cfg = ModelConfig(family="llama", vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=1,
                      num_heads=4, num_kv_heads=4, head_dim=16)
    exact = jnp.einsum("btnh,nhd->btd", x, w)
    np.testing.assert_array_equal(project("btnh,nhd->btd", x, w, cfg), exact)
    fp8 = project("btnh,nhd->btd", x, w, cfg.replace(matmul_dtype="fp8"))
    assert fp8.shape == exact.shape and 0 < float(jnp.abs(fp8 - exact).max() / jnp.abs(exact).max()) < 0.05
    with pytest.raises(ValueError, match="matmul_dtype"):
        cfg.replace(matmul_dtype="float8")


def test_fp8_gradients_stay_close_and_run_in_fp8():
    x = jax.random.normal(jax.random.key(4), (2, 8, 64), jnp.bfloat16)
    w = (jax.random.normal(jax.random.key(5), (64, 32)) * 0.1).astype(jnp.bfloat16)

    def loss(fn):
        return lambda x, w: jnp.sum(fn(x, w).astype(jnp.float32) ** 2)

    fp8 = jax.jit(jax.grad(loss(lambda x, w: fp8_projection(x, w, 1)), argnums=(0, 1)))
    exact = jax.grad(loss(lambda x, w: jnp.einsum("btd,df->btf", x, w, preferred_element_type=jnp.float32)),
                     argnums=(0, 1))(x.astype(jnp.float32), w.astype(jnp.float32))
    for got, want in zip(fp8(x, w), exact):
        assert float(jnp.abs(got.astype(jnp.float32) - want).max() / jnp.abs(want).max()) < 0.1
    program = fp8.lower(x, w).as_text()
    dots = re.findall(r"stablehlo.dot_general.*", program)
    assert sum("f8E4M3FN" in d for d in dots) >= 1 and sum("f8E5M2" in d for d in dots) >= 2, dots


def test_training_setting_reaches_the_model():
    from longrm_jax.training.config import load_config
    from longrm_jax.training.model_setup import with_training_numerics

    mcfg = ModelConfig(family="llama", vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=1,
                       num_heads=4, num_kv_heads=4, head_dim=16)
    assert with_training_numerics(mcfg, load_config(None, ["model.matmul_dtype=fp8"])).matmul_dtype == "fp8"
    assert with_training_numerics(mcfg, load_config(None, [])).matmul_dtype == "compute"


def test_fp8_forward_keeps_the_gradients_of_the_compute_dtype():
    """``fp8_forward``: the forward rounded as ``fp8``'s, the gradients those of the unrounded product (a loss
    linear in the output has the same gradients exactly), and no float8_e5m2 in the program."""
    x = jax.random.normal(jax.random.key(6), (2, 8, 64))
    w = jax.random.normal(jax.random.key(7), (64, 32)) * 0.1
    c = jax.random.normal(jax.random.key(8), (2, 8, 32))
    linear = lambda fn: (lambda x, w: jnp.sum(fn(x, w) * c))
    got = jax.grad(linear(lambda x, w: fp8_projection(x, w, 1, "fp8_forward")), argnums=(0, 1))(x, w)
    want = jax.grad(linear(lambda x, w: jnp.einsum("btd,df->btf", x, w)), argnums=(0, 1))(x, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(fp8_projection(x, w, 1, "fp8_forward"), fp8_projection(x, w, 1, "fp8"))
    step = jax.value_and_grad(linear(lambda x, w: fp8_projection(x, w, 1, "fp8_forward")))
    program = jax.jit(step).lower(x, w).as_text()
    assert "f8E4M3FN" in program and "f8E5M2" not in program
