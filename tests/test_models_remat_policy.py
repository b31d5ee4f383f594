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


def test_ring_keeps_its_out_and_lse_under_a_mesh(capsys):
    """On a multi-device mesh the Pallas kernels run inside ring attention's shard_map (a ring of one without a
    seq axis): the policy must keep the ring's out and LSE there too, or every layer's attention forward runs
    twice (seen on 4 GPUs: 72 forward kernel calls for 36 layers)."""
    from jax.sharding import PartitionSpec as P

    from longrm_jax.ops.ring import ring_attention
    from longrm_jax.parallel.mesh import make_mesh

    def layer(x, wq, wk, wv):
        q = (x @ wq).reshape(B, T, H, D)
        k = (x @ wk).reshape(B, T, KH, D)
        v = (x @ wv).reshape(B, T, KH, D)
        return jnp.sum(jnp.sin(ring_attention(q, k, v, impl="xla")))

    mesh = make_mesh(data=2, fsdp=1, seq=1, tensor=1, devices=jax.devices()[:2])
    args = _args()
    with jax.set_mesh(mesh):
        args = (jax.device_put(args[0], jax.sharding.NamedSharding(mesh, P("data"))),) + args[1:]
        print_saved_residuals(jax.checkpoint(layer, policy=save_attention_policy), *args)
        saved = [line for line in capsys.readouterr().out.splitlines() if line and "from the argument" not in line]
        # The ring's named out and LSE leave its shard_map as residuals (reported as the shard_map's outputs).
        assert len(saved) == 2, saved
        assert any(line.startswith(f"f32[{B},{T},{H},{D}] output of shard_map") for line in saved), saved
        assert any(line.startswith(f"f32[{B},{H},{T}] output of shard_map") for line in saved), saved
        full, saving = jax.checkpoint(layer), jax.checkpoint(layer, policy=save_attention_policy)
        grads = lambda f: jax.grad(f, argnums=(0, 1, 2, 3))
        forward_calls = lambda f: str(jax.make_jaxpr(grads(f))(*args)).count("custom_vjp_call")
        assert forward_calls(saving) == forward_calls(full) - 1
        for a, b in zip(jax.jit(grads(full))(*args), jax.jit(grads(saving))(*args)):
            assert jnp.allclose(a, b, rtol=1e-6, atol=1e-7)
