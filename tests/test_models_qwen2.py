"""Qwen2 / Qwen2.5 (issue 43): fp32 parity with transformers on tiny random checkpoints, both heads, GQA 1:1 /
4:1, tied / untied, default and YaRN RoPE; q/k/v biases without an o_proj bias; sliding-window layers
(use_sliding_window, max_window_layers); the export round trip."""

import pytest

import torch  # noqa: F401  (the test extra installs it: a broken install fails the run, never skips)
import transformers

from longrm_jax import load_pretrained
from helpers.family_parity import check_causal_lm, check_classifier, check_round_trip, make_model

VOCAB = 256


def qwen2_config(kv_heads=2, tied=False, rope=None, **extra):
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, **(rope or {})}
    return transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=256, rope_parameters=rope_parameters,
        tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6, **extra)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("kv_heads,tied,rope", [(1, True, None), (4, False, YARN)], ids=["gqa4-tied", "mha-yarn"])
def test_causal_lm_parity_and_round_trip(tmp_path, kv_heads, tied, rope):
    ref = make_model("Qwen2ForCausalLM", qwen2_config(kv_heads, tied, rope), tmp_path / "src")
    model = load_pretrained(tmp_path / "src")
    cfg = model.config
    assert (cfg.family, cfg.qkv_bias, cfg.attention_bias, cfg.tie_word_embeddings) == ("qwen2", True, False, tied)
    assert "q_bias" in model.model.layers.names and "o_bias" not in model.model.layers.names
    check_causal_lm(model, ref, VOCAB)
    check_round_trip(model, tmp_path / "out", ref, "AutoModelForCausalLM", VOCAB, architecture="Qwen2ForCausalLM")


def test_classifier_parity_and_round_trip(tmp_path):
    ref = make_model("Qwen2ForSequenceClassification", qwen2_config(2, num_labels=1), tmp_path / "src")
    model = load_pretrained(tmp_path / "src")
    assert type(model).__name__ == "SequenceClassifier" and model.config.num_labels == 1
    check_classifier(model, ref, VOCAB, 1)
    check_round_trip(model, tmp_path / "out", ref, "AutoModelForSequenceClassification", VOCAB,
                     architecture="Qwen2ForSequenceClassification")


@pytest.mark.parametrize("family", ["Qwen2", "Qwen3"])
def test_sliding_window_layers(tmp_path, family):
    """use_sliding_window: the layers from max_window_layers on see the 8 latest keys (40 tokens here); Qwen3's
    config has the same keys and meaning."""
    config = qwen2_config(2, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    if family == "Qwen3":
        config = transformers.Qwen3Config(**{**config.to_dict(), "head_dim": 16})
    ref = make_model(f"{family}ForCausalLM", config, tmp_path / "src")
    model = load_pretrained(tmp_path / "src")
    assert model.config.local_layers == (False, True) and model.config.sliding_window == 8
    check_causal_lm(model, ref, VOCAB, width=40)
    reloaded = check_round_trip(model, tmp_path / "out", ref, "AutoModelForCausalLM", VOCAB)
    assert reloaded.config.layer_types == ["full_attention", "sliding_attention"]
