"""Building the model a run trains: presets for random init, HF checkpoints, or a training checkpoint.

Parameters are created directly sharded: the model is first built abstractly (``nnx.eval_shape``) to read its
logical axis names, then a jitted initialiser writes each parameter with its fsdp-style ``NamedSharding``.
"""

from __future__ import annotations

import dataclasses
import os

import jax
from flax import nnx

from longrm_jax.hf.load import load_pretrained, read_hf_config
from longrm_jax.models import ModelConfig, build_model
from longrm_jax.models.config import from_hf_config
from longrm_jax.training.config import ConfigError, TrainConfig
from longrm_jax.training.params import ParamCodec, shardings
from longrm_jax.training.state import param_sharding_rules

# Architectures for random init. vocab_size / token ids of the tiny ones come from the run's tokenizer.
PRESETS: dict[str, dict] = {
    "tiny_qwen3": dict(family="qwen3", qk_norm=True, hidden_size=64, intermediate_size=128, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6,
                       max_position_embeddings=32768, tie_word_embeddings=True),
    "tiny_llama": dict(family="llama", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=5e5,
                       max_position_embeddings=32768),
    # The 8B shapes of docs/upstream.md "Architectures" (random weights: benchmarks).
    "qwen3_8b": dict(family="qwen3", qk_norm=True, vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6,
                     rope_theta=1e6, max_position_embeddings=131072, rope_type="yarn",
                     rope_scaling={"factor": 4.0, "original_max_position_embeddings": 32768},
                     pad_token_id=151643, eos_token_id=151645),
    "llama31_8b": dict(family="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
                       rope_theta=5e5, max_position_embeddings=131072, rope_type="llama3",
                       rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192},
                       pad_token_id=128004, eos_token_id=128009),
}


def preset_config(cfg: TrainConfig, tokenizer=None) -> ModelConfig:
    """ModelConfig for random init from ``cfg.model.preset`` + ``cfg.model.overrides``."""
    if cfg.model.preset not in PRESETS:
        raise ConfigError(f"model.preset {cfg.model.preset!r} unknown; presets: {sorted(PRESETS)}")
    fields = dict(PRESETS[cfg.model.preset])
    if tokenizer is not None and "vocab_size" not in fields:
        fields.update(vocab_size=len(tokenizer.hf), pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id)
    fields.update(cfg.model.overrides)
    valid = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = set(fields) - valid
    if unknown:
        raise ValueError(f"model.overrides: unknown ModelConfig fields {sorted(unknown)}; valid: {sorted(valid)}")
    return ModelConfig(**fields)


def with_training_numerics(mcfg: ModelConfig, cfg: TrainConfig) -> ModelConfig:
    # remat "auto" is resolved by training.memory_plan before the model is built; "full" stands in until then.
    remat = "full" if cfg.model.remat == "auto" else cfg.model.remat
    return mcfg.replace(head=cfg.head, dtype=cfg.model.compute_dtype, param_dtype=cfg.base_weights_dtype,
                        remat=remat, mlp_chunk_tokens=cfg.model.mlp_chunk_tokens,
                        offloaded_layers=cfg.model.offloaded_layers)


def init_random(mcfg: ModelConfig, mesh, seed: int, rules=None) -> tuple[ParamCodec, dict]:
    """(codec, sharded parameter values) of a randomly initialised model."""
    abstract = nnx.eval_shape(lambda: build_model(mcfg, rngs=nnx.Rngs(seed)))
    codec = ParamCodec(abstract)
    out_sh = shardings(codec.specs(mesh, rules), mesh)
    values = jax.jit(lambda: codec.values(build_model(mcfg, rngs=nnx.Rngs(seed))), out_shardings=out_sh)()
    return codec, values


def codec_for(mcfg: ModelConfig) -> ParamCodec:
    return ParamCodec(nnx.eval_shape(lambda: build_model(mcfg, rngs=nnx.Rngs(0))))


def trained_model(directory: str, step: int | None = None):
    """An NNX model (CausalLM or SequenceClassifier) with a training checkpoint's weights, LoRA merged, in
    float32 compute: what ``python -m longrm_jax.export`` writes with ``hf.save.save_pretrained``."""
    import jax.numpy as jnp

    from longrm_jax.training.checkpoint import load_trained_weights  # orbax: imported for a training checkpoint only

    mcfg, params = load_trained_weights(directory, step)
    mcfg = mcfg.replace(dtype="float32", remat="none")
    return codec_for(mcfg).model({k: jnp.asarray(v) for k, v in params.items()})


def model_config(cfg: TrainConfig, tokenizer=None) -> ModelConfig:
    """The ModelConfig ``load_model`` will build, read without loading any weights (config.json of an HF
    checkpoint, the metadata of a training checkpoint, or the preset)."""
    init = cfg.model.init
    if init is None:
        return with_training_numerics(preset_config(cfg, tokenizer), cfg)
    _check_init_dir(init)
    if os.path.exists(os.path.join(init, "config.json")):
        mcfg = with_training_numerics(from_hf_config(read_hf_config(init), head=cfg.head), cfg)
        return mcfg.replace(**cfg.model.overrides) if cfg.model.overrides else mcfg
    from longrm_jax.training.checkpoint import trained_model_config  # orbax: imported for a training checkpoint only

    return with_training_numerics(trained_model_config(init), cfg)


def _check_init_dir(init: str) -> None:
    if not os.path.isdir(init):
        raise FileNotFoundError(
            f"model.init: {init} is not a directory (HF checkpoint or training checkpoint); where it is another "
            "run's checkpoints (a stage-2 config starts from stage 1's), train that run first, or set "
            "model.init=null to start from random weights of model.preset")


def load_model(cfg: TrainConfig, mesh, tokenizer=None) -> tuple[ModelConfig, ParamCodec, dict]:
    """(model config, codec, sharded values) for ``cfg.model.init``: None (random preset), an HF checkpoint
    directory (``config.json``), or a training checkpoint directory of this package (orbax)."""
    init = cfg.model.init
    if init is None:
        mcfg = with_training_numerics(preset_config(cfg, tokenizer), cfg)
        codec, values = init_random(mcfg, mesh, cfg.seed, param_sharding_rules(cfg.mesh.param_axes))
        return mcfg, codec, values
    _check_init_dir(init)
    if os.path.exists(os.path.join(init, "config.json")):
        return _load_hf(cfg, init, mesh)
    from longrm_jax.training.checkpoint import load_trained_weights  # orbax: imported for a training checkpoint only

    mcfg, values = load_trained_weights(init)
    mcfg = with_training_numerics(mcfg, cfg)
    codec = codec_for(mcfg)
    rules = param_sharding_rules(cfg.mesh.param_axes)
    values = jax.device_put(values, shardings(codec.specs(mesh, rules), mesh))
    return mcfg, codec, values


def _load_hf(cfg: TrainConfig, path: str, mesh) -> tuple[ModelConfig, ParamCodec, dict]:
    model = load_pretrained(path, dtype=cfg.model.compute_dtype, param_dtype=cfg.base_weights_dtype,
                            mesh=mesh, head=cfg.head)
    mcfg = with_training_numerics(model.config, cfg)
    if cfg.model.overrides:
        mcfg = mcfg.replace(**cfg.model.overrides)
    codec = codec_for(mcfg)
    rules = param_sharding_rules(cfg.mesh.param_axes)
    values = jax.device_put(ParamCodec(model).values(model), shardings(codec.specs(mesh, rules), mesh))
    return mcfg, codec, values
