"""Loading onto a mesh of 8 (fake CPU) devices: each weight lands in its NamedSharding, outputs unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips
import transformers  # noqa: F401

from longrm_jax import load_pretrained  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402
from longrm_jax.parallel.mesh import make_mesh  # noqa: E402

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (tests/conftest.py fakes them)")


@pytest.fixture(scope="module")
def sharded_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    # Sharded safetensors with an index, like real checkpoints.
    make_tiny_checkpoint(path, "qwen3", kv_heads=2, max_shard_size="60KB", rope="yarn")
    return path


@pytest.mark.parametrize("mesh_shape", [dict(fsdp=8), dict(fsdp=4, tensor=2)], ids=["fsdp8", "fsdp4xtp2"])
def test_sharded_load_matches_single_device(sharded_ckpt, mesh_shape):
    assert (sharded_ckpt / "model.safetensors.index.json").is_file()
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 256, (8, 24)), jnp.int32)
    forward = jax.jit(lambda m, i: m(i))
    reference = np.asarray(forward(load_pretrained(sharded_ckpt), ids))

    mesh = make_mesh(**mesh_shape)
    model = load_pretrained(sharded_ckpt, mesh=mesh)
    q_proj = model.model.layers.q_proj[...]  # [layers, embed, heads, head_dim]
    fsdp, tensor = mesh.shape["fsdp"], mesh.shape["tensor"]
    assert q_proj.sharding.mesh == mesh
    assert q_proj.addressable_shards[0].data.shape == (2, 64 // fsdp, 4 // tensor, 24)
    embed = model.model.embed[...]  # [vocab, embed]
    assert embed.addressable_shards[0].data.shape == (256 // tensor, 64 // fsdp)
    down = model.model.layers.down_proj[...]  # [layers, mlp, embed]
    assert down.addressable_shards[0].data.shape == (2, 128 // tensor, 64 // fsdp)

    with jax.set_mesh(mesh):
        out = np.asarray(forward(model, ids))
        single = np.asarray(forward(model, ids[:1]))  # batch 1 does not divide over fsdp: stays replicated
    np.testing.assert_allclose(out, reference, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(single, reference[:1], rtol=2e-5, atol=2e-5)


def test_export_from_sharded_model_reproduces_checkpoint(sharded_ckpt, tmp_path):
    from longrm_jax.hf.save import save_pretrained
    from longrm_jax.hf.load import weight_files

    model = load_pretrained(sharded_ckpt, mesh=make_mesh(fsdp=4, tensor=2))
    save_pretrained(model, tmp_path / "out", progress=False)
    original, exported = weight_files(sharded_ckpt), weight_files(tmp_path / "out")
    assert set(original) == set(exported)
    for name, f in original.items():
        assert f.read(name).tobytes() == exported[name].read(name).tobytes(), name
