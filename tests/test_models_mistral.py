"""Mistral (issue 43): fp32 parity with transformers on tiny random checkpoints, both heads, GQA 1:1 / 2:1 /
4:1, tied / untied, a head_dim unlike hidden / heads (Mistral-Nemo: 128 with hidden 5120 and 32 heads), default
and linear RoPE; the export round trip; a sliding window on every layer (set, or MistralConfig's default of 4096
for an absent key)."""

import json

import pytest

import torch  # noqa: F401  (the test extra installs it: a broken install fails the run, never skips)
import transformers

from longrm_jax import load_pretrained
from helpers.family_parity import check_causal_lm, check_classifier, check_round_trip, make_model

VOCAB = 256


def mistral_config(kv_heads=2, tied=False, head_dim=None, rope=None, sliding_window=None, **extra):
    rope_parameters = {"rope_type": "default", "rope_theta": 1e6, **(rope or {})}
    return transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=256, sliding_window=sliding_window,
        rope_parameters=rope_parameters, tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rms_norm_eps=1e-5, **extra)


@pytest.mark.parametrize("kv_heads,tied,head_dim,rope", [
    (1, False, 32, None),  # Nemo-like: head_dim 32 with hidden 64 and 4 heads
    (4, True, None, {"rope_type": "linear", "factor": 2.0}),
], ids=["gqa4-headdim32", "mha-tied-linear"])
def test_causal_lm_parity_and_round_trip(tmp_path, kv_heads, tied, head_dim, rope):
    ref = make_model("MistralForCausalLM", mistral_config(kv_heads, tied, head_dim, rope), tmp_path / "src")
    model = load_pretrained(tmp_path / "src")
    cfg = model.config
    assert (cfg.family, cfg.head_dim, cfg.tie_word_embeddings) == ("mistral", head_dim or 16, tied)
    check_causal_lm(model, ref, VOCAB)
    reloaded = check_round_trip(model, tmp_path / "out", ref, "AutoModelForCausalLM", VOCAB,
                                architecture="MistralForCausalLM")
    assert reloaded.config.sliding_window is None


def test_classifier_parity_and_round_trip(tmp_path):
    ref = make_model("MistralForSequenceClassification", mistral_config(2, head_dim=24, num_labels=3),
                     tmp_path / "src")
    model = load_pretrained(tmp_path / "src")
    assert type(model).__name__ == "SequenceClassifier" and model.config.num_labels == 3
    check_classifier(model, ref, VOCAB, 3)
    check_round_trip(model, tmp_path / "out", ref, "AutoModelForSequenceClassification", VOCAB,
                     architecture="MistralForSequenceClassification")


def test_sliding_window(tmp_path):
    """Mistral v0.1's sliding_window slides on every layer: 8 keys here, at 40 tokens."""
    ref = make_model("MistralForCausalLM", mistral_config(2, sliding_window=8), tmp_path / "src")
    model = load_pretrained(tmp_path / "src")
    assert model.config.local_layers == (True, True) and model.config.sliding_window == 8
    check_causal_lm(model, ref, VOCAB, width=40)
    assert check_round_trip(model, tmp_path / "out", ref, "AutoModelForCausalLM", VOCAB).config.sliding_window == 8


def test_absent_sliding_window_is_mistral_default(tmp_path):
    """No 'sliding_window' key: transformers applies MistralConfig's 4096, and so do we."""
    make_model("MistralForCausalLM", mistral_config(2), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["sliding_window"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_pretrained(tmp_path).config.sliding_window == 4096
