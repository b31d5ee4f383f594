"""The ``save_attention_out`` remat policy keeps exactly the flash kernel's forward outputs (output and LSE) and
recomputes everything else: the backward re-runs the q/k/v projections but not the attention forward."""

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import print_saved_residuals

from longrm_jax.models.layers import remat_policy, save_attention_policy
from longrm_jax.ops.flash import HybridKernel

B, T, H, KH, D = 2, 64, 4, 2, 16


def _layer(kernel):
    def layer(x, wq, wk, wv):
        q = (x @ wq).reshape(B, T, H, D)
        k = (x @ wk).reshape(B, T, KH, D)
        v = (x @ wv).reshape(B, T, KH, D)
        out, _ = kernel._with_lse(q, k, v, None, None, True, None)
        return jnp.sum(jnp.sin(out))

    return layer


def _args():
    keys = jax.random.split(jax.random.key(0), 4)
    return (jax.random.normal(keys[0], (B, T, 32)), 0.1 * jax.random.normal(keys[1], (32, H * D)),
            0.1 * jax.random.normal(keys[2], (32, KH * D)), 0.1 * jax.random.normal(keys[3], (32, KH * D)))


def test_policy_saves_only_kernel_out_and_lse(capsys):
    assert remat_policy("save_attention_out") == (True, save_attention_policy)
    layer = jax.checkpoint(_layer(HybridKernel("xla")), policy=save_attention_policy)
    print_saved_residuals(layer, *_args())
    saved = [line for line in capsys.readouterr().out.splitlines() if line and "from the argument" not in line]
    assert len(saved) == 2, saved  # out and lse; q, k, v and everything else are recomputed
    assert any(line.startswith(f"f32[{B},{T},{H},{D}] named 'attention_kernel_out'") for line in saved), saved
    assert any(line.startswith(f"f32[{B},{H},{T}] named 'attention_kernel_lse'") for line in saved), saved


def test_policy_drops_one_forward_kernel_and_keeps_gradients():
    kernel = HybridKernel("xla")
    args = _args()
    full = jax.checkpoint(_layer(kernel))
    saving = jax.checkpoint(_layer(kernel), policy=save_attention_policy)
    count = lambda f: str(jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2, 3)))(*args)).count("custom_vjp_call")
    assert count(saving) == count(full) - 1  # the backward no longer re-runs the attention forward
    g_full, g_saving = jax.grad(full, argnums=(0, 1, 2, 3))(*args), jax.grad(saving, argnums=(0, 1, 2, 3))(*args)
    for a, b in zip(g_full, g_saving):
        assert jnp.allclose(a, b, rtol=1e-6, atol=1e-7)
