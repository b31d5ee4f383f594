"""NNX Llama / Qwen3 decoder: config, RoPE, layers, heads and KV cache."""

from longrm_jax.models.cache import KVCache
from longrm_jax.models.config import ModelConfig, from_hf_config, to_hf_config
from longrm_jax.models.decoder import Decoder
from longrm_jax.models.heads import CausalLM, SequenceClassifier, build_model, pooled_index

__all__ = [
    "CausalLM",
    "Decoder",
    "KVCache",
    "ModelConfig",
    "SequenceClassifier",
    "build_model",
    "from_hf_config",
    "pooled_index",
    "to_hf_config",
]
