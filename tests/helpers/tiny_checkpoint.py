"""Tiny random Hugging Face checkpoints built locally for tests (no hub access).

Needs torch and transformers (the ``test`` extra), imported inside the builders.
"""

from __future__ import annotations

import os

ROPE_CASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}


def tiny_hf_config(family: str = "llama", head: str = "causal_lm", *, rope: str = "default", kv_heads: int = 2,
                   tied: bool = False, num_labels: int = 1, pad_token_id: int | None = 0, vocab_size: int = 256,
                   hidden_size: int = 64, layers: int = 2, heads: int = 4, head_dim: int | None = None,
                   rope_theta: float = 10000.0, **extra):
    """A transformers ``LlamaConfig`` / ``Qwen3Config`` / ``Gemma3TextConfig`` of a tiny model (hidden 64, 2 layers,
    vocab 256). Gemma 3: one sliding layer (window 8) then a full one, each with its own RoPE, as Gemma 3 mixes
    them; the RoPE case applies to the full-attention layers."""
    import transformers

    rope_parameters = {"rope_theta": rope_theta, **ROPE_CASES[rope]}
    kwargs = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=256, rope_parameters=rope_parameters, tie_word_embeddings=tied,
        pad_token_id=pad_token_id, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6,
    )
    if head == "classifier":
        kwargs["num_labels"] = num_labels
    if family == "qwen3":
        kwargs["head_dim"] = head_dim or 24  # deliberately != hidden / heads: Qwen3's independent head_dim
        config_cls = transformers.Qwen3Config
    elif family == "gemma3":
        kwargs.update(head_dim=head_dim or 16, query_pre_attn_scalar=24, sliding_window=8,
                      layer_types=(["sliding_attention", "full_attention"] * layers)[:layers],
                      rope_parameters={"full_attention": rope_parameters,
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
        config_cls = transformers.Gemma3TextConfig
    else:
        if head_dim:
            kwargs["head_dim"] = head_dim
        config_cls = transformers.LlamaConfig
    kwargs.update(extra)
    return config_cls(**kwargs)


def tiny_hf_model(config, head: str = "causal_lm", seed: int = 0):
    """A transformers model for ``config`` whose weights are O(0.1) random (norm weights ~1), in eval mode.

    HF's own init (std 0.02) leaves activations so small that a wrong RoPE or norm would hide in the noise.
    """
    import torch
    import transformers

    family = {"qwen3": "Qwen3", "gemma3_text": "Gemma3Text"}.get(config.model_type, "Llama")
    suffix = "ForCausalLM" if head == "causal_lm" else "ForSequenceClassification"
    cls = getattr(transformers, family + suffix)
    torch.manual_seed(seed)
    model = cls(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            param.copy_((1 + 0.1 * noise) if "norm" in name else 0.1 * noise)
    return model.eval()


def make_tiny_checkpoint(out_dir: str | os.PathLike, family: str = "llama", head: str = "causal_lm", *,
                         seed: int = 0, dtype=None, max_shard_size=None, **config_kwargs):
    """Write a tiny random HF checkpoint to ``out_dir``; returns the torch model (for reference outputs)."""
    config = tiny_hf_config(family, head, **config_kwargs)
    model = tiny_hf_model(config, head, seed)
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(os.fspath(out_dir), **kwargs)
    return model


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def make_tiny_model_dir(out_dir: str | os.PathLike, family: str = "qwen3", head: str = "causal_lm", *,
                        stop_every: int | None = None, **checkpoint_kwargs):
    """What ``python -m longrm_jax.evaluate --model-path`` takes: a tiny random checkpoint (vocabulary 650, pad 0,
    2 KV heads unless given) with the committed tiny tokenizer beside it. ``stop_every=3``: every third token id
    from 3 on ends a judgement (generation_config.json), so greedy rows stop at different steps. Returns the
    torch model."""
    import json
    import shutil

    from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR

    kwargs = {"vocab_size": 650, "pad_token_id": 0, "kv_heads": 2, **checkpoint_kwargs}
    model = make_tiny_checkpoint(out_dir, family, head, **kwargs)
    for item in TOKENIZER_FILES:
        shutil.copy(os.path.join(TINY_TOKENIZER_DIR, item), os.path.join(out_dir, item))
    if stop_every:
        with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": list(range(3, kwargs["vocab_size"], stop_every))}, f)
    return model
