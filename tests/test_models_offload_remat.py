"""Offloading remat policies (``offload_layer_inputs``, ``offload_layer_inputs_and_attention``): what they save
goes to pinned host memory, and the gradients equal ``remat: full``.

On the CPU backend every memory kind is host RAM and XLA:CPU compiles host placement away, so these tests check
the plumbing where it is decided, in the differentiated program (jaxpr): the saved tensors are typed as host
values (``f32<host>[...]``), the scan stacks the *host* copy of each layer input (no device copy of the stack
remains), and the values are exact. That the GPU compile really places them in host memory is shown by the
deviceless H200 compile (docs/perf_training.md, "Long pairs": host temporaries of 72 GiB at 2 x 128K)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from longrm_jax.models import ModelConfig, build_model
from longrm_jax.models.layers import (offload_layer_inputs_and_attention_policy, offload_layer_inputs_policy,
                                      remat_policy)
from longrm_jax.ops.flash import HybridKernel

LAYERS, B, T, D = 3, 2, 10, 32


def _tiny(remat):
    cfg = ModelConfig(vocab_size=128, hidden_size=D, intermediate_size=64, num_layers=LAYERS, num_heads=4,
                      num_kv_heads=2, head_dim=8, family="llama", initializer_range=0.2, pad_token_id=0,
                      remat=remat)
    return build_model(cfg, rngs=nnx.Rngs(3))


IDS = jnp.asarray(np.random.default_rng(1).integers(1, 128, (B, T)), jnp.int32)


def _loss(model):
    return jnp.mean(jax.nn.log_softmax(model(IDS))[..., 5])


def test_offload_policies_resolve():
    assert remat_policy("offload_layer_inputs") == (True, offload_layer_inputs_policy)
    assert remat_policy("offload_layer_inputs_and_attention") == (True, offload_layer_inputs_and_attention_policy)


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["offload_layer_inputs", "offload_layer_inputs_and_attention"])
def test_scan_saves_the_host_copy_of_each_layer_input_and_gradients_equal_full(remat):
    stacked = rf"f32(<host>)?\[{LAYERS},{B},{T},{D}\]"  # one layer input per layer, stacked by the scan
    full_jaxpr = str(jax.make_jaxpr(nnx.value_and_grad(_loss))(_tiny("full")))
    offload_jaxpr = str(jax.make_jaxpr(nnx.value_and_grad(_loss))(_tiny(remat)))
    assert {m.group(0) for m in re.finditer(stacked, full_jaxpr)} == {f"f32[{LAYERS},{B},{T},{D}]"}
    assert {m.group(0) for m in re.finditer(stacked, offload_jaxpr)} == {f"f32<host>[{LAYERS},{B},{T},{D}]"}
    assert "offload_dst='pinned_host'" in offload_jaxpr

    ref_loss, ref_grads = jax.jit(nnx.value_and_grad(_loss))(_tiny("full"))
    loss, grads = jax.jit(nnx.value_and_grad(_loss))(_tiny(remat))
    np.testing.assert_array_equal(np.asarray(loss), np.asarray(ref_loss))
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)


def test_attention_out_and_lse_go_to_the_host():
    """The attention kernel's named out and LSE (ops.kernel_vjp) are offloaded, q/k/v are recomputed; with the
    CPU's xla kernel behind the same custom VJP the GPU kernels use."""
    kernel = HybridKernel("xla")
    h, kh, hd = 4, 2, 8
    keys = jax.random.split(jax.random.key(0), 4)
    args = (jax.random.normal(keys[0], (B, T, D)), 0.1 * jax.random.normal(keys[1], (D, h * hd)),
            0.1 * jax.random.normal(keys[2], (D, kh * hd)), 0.1 * jax.random.normal(keys[3], (D, kh * hd)))

    def layer(x, wq, wk, wv):
        q, k, v = (x @ wq).reshape(B, T, h, hd), (x @ wk).reshape(B, T, kh, hd), (x @ wv).reshape(B, T, kh, hd)
        out, _ = kernel._with_lse(q, k, v, None, None, True, None)
        return jnp.sum(jnp.sin(out))

    offloading = jax.checkpoint(layer, policy=offload_layer_inputs_and_attention_policy)
    jaxpr = str(jax.make_jaxpr(jax.grad(offloading, argnums=(0, 1, 2, 3)))(*args))
    assert set(re.findall(r"f32<host>\[[0-9,]+\]", jaxpr)) == {f"f32<host>[{B},{T},{h},{hd}]", f"f32<host>[{B},{h},{T}]"}
    ref = jax.grad(jax.checkpoint(layer), argnums=(0, 1, 2, 3))(*args)
    got = jax.grad(offloading, argnums=(0, 1, 2, 3))(*args)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def _tiny_split(remat, offloaded):
    cfg = ModelConfig(vocab_size=128, hidden_size=D, intermediate_size=64, num_layers=LAYERS, num_heads=4,
                      num_kv_heads=2, head_dim=8, family="llama", initializer_range=0.2, pad_token_id=0,
                      remat=remat, offloaded_layers=offloaded)
    return build_model(cfg, rngs=nnx.Rngs(3))


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["offload_layer_inputs", "offload_layer_inputs_and_attention"])
def test_offloaded_layers_puts_only_the_first_layers_inputs_on_the_host(remat):
    """ModelConfig.offloaded_layers = 1 of 3: the first layer's input is saved on the host, the other two on the
    device (the policy's on-device twin), and loss and gradients equal ``full``; 0 and 3 are the two ends."""
    def stacks(model):
        jaxpr = str(jax.make_jaxpr(nnx.value_and_grad(_loss))(model))
        return {m.group(0) for m in re.finditer(rf"f32(<host>)?\[\d,{B},{T},{D}\]", jaxpr)}

    assert stacks(_tiny_split(remat, 1)) == {f"f32<host>[1,{B},{T},{D}]", f"f32[2,{B},{T},{D}]"}
    assert stacks(_tiny_split(remat, 0)) == {f"f32[{LAYERS},{B},{T},{D}]"}
    assert stacks(_tiny_split(remat, LAYERS)) == {f"f32<host>[{LAYERS},{B},{T},{D}]"}
    ref_loss, ref_grads = jax.jit(nnx.value_and_grad(_loss))(_tiny("full"))
    loss, grads = jax.jit(nnx.value_and_grad(_loss))(_tiny_split(remat, 1))
    np.testing.assert_allclose(np.asarray(loss), np.asarray(ref_loss), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)


def test_offloaded_layers_is_checked():
    with pytest.raises(ValueError, match=r"offloaded_layers must be in \[0, num_layers=3\]"):
        _tiny_split("offload_layer_inputs", 4)
