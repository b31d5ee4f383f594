"""LoRA on the flat parameter dict: matrix views from logical names, merge = W + alpha/r A @ B, targets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax.training import lora


def test_matrix_views_follow_logical_names():
    assert lora.matrix_view((2, 64, 4, 16), ("layers", "embed", "heads", "head_dim")) == (1, 64, 64)
    assert lora.matrix_view((2, 4, 16, 64), ("layers", "heads", "head_dim", "embed")) == (1, 64, 64)
    assert lora.matrix_view((2, 128, 64), ("layers", "mlp", "embed")) == (1, 128, 64)
    with pytest.raises(ValueError, match="needs a matrix"):
        lora.matrix_view((2, 64), ("layers", "norm"))


def test_merge_adds_scaled_low_rank_delta_and_starts_at_zero():
    keys = ["model/layers/q_proj", "model/layers/o_proj", "model/layers/attn_norm", "score"]
    assert lora.select_targets(keys, ["all-linear"]) == ["model/layers/o_proj", "model/layers/q_proj"]
    assert lora.select_train_modules(keys, ["score"]) == ["score"]
    with pytest.raises(ValueError, match="match no parameter"):
        lora.select_targets(keys, ["gate_proj"])
    rng = np.random.default_rng(0)
    base = {"model/layers/o_proj": jnp.asarray(rng.normal(size=(2, 4, 3, 8)), jnp.float32)}
    names = {"model/layers/o_proj": ("layers", "heads", "head_dim", "embed")}
    adapters = lora.init_adapters({k: v.shape for k, v in base.items()}, names, list(base), 2, jax.random.key(0))
    assert adapters["model/layers/o_proj/lora_a"].shape == (2, 12, 2)
    np.testing.assert_array_equal(lora.merge(base, adapters, alpha=8, rank=2)["model/layers/o_proj"],
                                  base["model/layers/o_proj"])
    adapters["model/layers/o_proj/lora_b"] = jnp.asarray(rng.normal(size=(2, 2, 8)), jnp.float32)
    a, b = np.asarray(adapters["model/layers/o_proj/lora_a"]), np.asarray(adapters["model/layers/o_proj/lora_b"])
    want = np.asarray(base["model/layers/o_proj"]) + 4.0 * np.einsum("lir,lro->lio", a, b).reshape(2, 4, 3, 8)
    np.testing.assert_allclose(lora.merge(base, adapters, alpha=8, rank=2)["model/layers/o_proj"], want, rtol=1e-5)


def test_disrm_config_trains_upstreams_parameter_set():
    """configs/llama31_8b_disrm_bt.yaml: rank-8 adapters on every linear layer and on `score` (a LoRA target,
    as upstream's peft CAUSAL_LM task), nothing trained fully; the former choice stays a setting."""
    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.training.config import load_config
    from longrm_jax.training.model_setup import init_random, preset_config, with_training_numerics
    from longrm_jax.training.state import split_trainable

    tiny = ["model.init=null", "model.preset=tiny_llama", "model.overrides={vocab_size: 256}"]
    cfg = load_config("configs/llama31_8b_disrm_bt.yaml", tiny)
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    codec, values = init_random(with_training_numerics(preset_config(cfg), cfg), mesh, 0)
    trainable, frozen = split_trainable(cfg.lora, codec, values, jax.random.key(0))
    linear = [k for k in values if k.rsplit("/", 1)[-1] in lora.ALL_LINEAR]
    assert len(linear) == 7 and "score" in values
    assert set(trainable) == {k + s for k in linear + ["score"] for s in ("/lora_a", "/lora_b")}
    assert set(frozen) == set(values)  # every base weight frozen, the head included
    assert trainable["score/lora_a"].shape == (64, 8) and trainable["score/lora_b"].shape == (8, 1)
    assert cfg.lora.rank == 8 and cfg.lora.alpha == 8
    old = load_config("configs/llama31_8b_disrm_bt.yaml",
                      tiny + ["lora.targets=[all-linear]", "lora.train_modules=[score]"])
    trainable, frozen = split_trainable(old.lora, codec, values, jax.random.key(0))
    assert "score" in trainable and "score" not in frozen and "score/lora_a" not in trainable
