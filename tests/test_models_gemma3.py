"""Gemma 3 text decoders (issue 43): fp32 parity with transformers on tiny random checkpoints of 7 layers (local
sliding-window layers and a global one: transformers' default pattern of five local layers per global one) at
sequences longer than the window. Each Gemma rule is exercised: the window, RoPE theta 10K on local layers and
linear-scaled 1M on global ones, q/k RMSNorm, four (1 + weight) norms per layer, GeGLU with tanh GELU, embeddings
times sqrt(hidden), query_pre_attn_scalar unlike head_dim, the final logit cap; Gemma3ForCausalLM, the language
model of Gemma3ForConditionalGeneration (vision tower skipped), both score heads; the export round trip."""

import json
import logging

import numpy as np
import pytest

import torch
import transformers

import jax
import jax.numpy as jnp

from longrm_jax import load_pretrained
from longrm_jax.hf.load import CheckpointError
from helpers.family_parity import check_causal_lm, check_classifier, check_round_trip, make_model, rel_err, TOL

VOCAB = 256
WINDOW = 8


def text_config(kv_heads=1, tied=True, softcap=None, **extra):
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=7, num_attention_heads=4,
        num_key_value_heads=kv_heads, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
        max_position_embeddings=256, tie_word_embeddings=tied, final_logit_softcapping=softcap,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        pad_token_id=0, bos_token_id=2, eos_token_id=1, **extra)


def multimodal_config(tied=True, **text):
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    return transformers.Gemma3Config(text_config=text_config(tied=tied, **text), vision_config=vision,
                                     mm_tokens_per_image=4, tie_word_embeddings=tied)


def test_text_causal_lm(tmp_path):
    ref = make_model("Gemma3ForCausalLM", text_config(kv_heads=1, softcap=3.0), tmp_path / "src")
    model = load_pretrained(tmp_path / "src")
    cfg = model.config
    assert cfg.local_layers == (True,) * 5 + (False, True) and cfg.sliding_window == WINDOW
    assert (cfg.rope_type, cfg.rope_theta, cfg.local_rope_theta) == ("linear", 1e6, 1e4)
    assert cfg.tie_word_embeddings and cfg.query_pre_attn_scalar == 24 and cfg.final_logit_softcapping == 3.0
    check_causal_lm(model, ref, VOCAB, width=40)
    check_round_trip(model, tmp_path / "out", ref, "AutoModelForCausalLM", VOCAB, architecture="Gemma3ForCausalLM")
    with pytest.raises(NotImplementedError, match="final_logit_softcapping"):
        model.lm_head_weight()


def test_multimodal_checkpoint_language_model(tmp_path, caplog):
    """Gemma3ForConditionalGeneration (4B-27B): the text model under language_model, untied here, GQA 2:1."""
    ref = make_model("Gemma3ForConditionalGeneration", multimodal_config(tied=False, kv_heads=2), tmp_path / "src")
    with caplog.at_level(logging.INFO, logger="longrm_jax.hf.load"):
        model = load_pretrained(tmp_path / "src")
    assert [r for r in caplog.records if "vision tower and projector skipped" in r.getMessage()]
    assert not model.config.tie_word_embeddings and model.lm_head is not None
    check_causal_lm(model, ref, VOCAB, width=40)
    check_round_trip(model, tmp_path / "out", ref, "AutoModelForCausalLM", VOCAB, architecture="Gemma3ForCausalLM",
                     exact=False)


@pytest.mark.parametrize("cls", ["Gemma3TextForSequenceClassification", "Gemma3ForSequenceClassification"])
def test_score_heads(tmp_path, cls):
    config = text_config(kv_heads=2, num_labels=1) if "Text" in cls else multimodal_config(kv_heads=2)
    if "Text" not in cls:
        config.num_labels = 1
    ref = make_model(cls, config, tmp_path / "src")
    model = load_pretrained(tmp_path / "src")
    assert type(model).__name__ == "SequenceClassifier" and model.config.num_labels == 1
    check_classifier(model, ref, VOCAB, 1, width=24)
    check_round_trip(model, tmp_path / "out", ref, "AutoModelForSequenceClassification", VOCAB,
                     architecture="Gemma3TextForSequenceClassification", exact="Text" in cls)


def test_cached_decoding_matches_one_forward(tmp_path):
    """Prefill then one-token steps through the KV cache (local layers masked by the window in the cache) give
    the logits of one full forward, past the window."""
    make_model("Gemma3ForCausalLM", text_config(kv_heads=2), tmp_path)
    model = load_pretrained(tmp_path)
    ids = jnp.asarray(np.random.default_rng(3).integers(3, VOCAB, (2, 24)), jnp.int32)
    full = np.asarray(model(ids))
    cache = model.init_cache(2, 32)
    step = jax.jit(lambda m, x, pos, c: m(x, positions=pos, cache=c))
    logits, cache = jax.jit(lambda m, x, c: m(x, cache=c, prefill=True))(model, ids[:, :6], cache)
    outs = [np.asarray(logits)]
    for t in range(6, 24):
        logits, cache = step(model, ids[:, t:t + 1], jnp.full((2, 1), t, jnp.int32), cache)
        outs.append(np.asarray(logits))
    assert rel_err(np.concatenate(outs, axis=1), full) <= TOL


def test_unsupported_settings_are_refused(tmp_path):
    make_model("Gemma3ForCausalLM", text_config(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key, value, message in [("attn_logit_softcapping", 50.0, "attention logit softcapping is not supported"),
                                ("use_bidirectional_attention", True, "only causal Gemma 3")]:
        (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(CheckpointError, match=message):
            load_pretrained(tmp_path)


def test_ring_attention_over_a_seq_mesh(tmp_path):
    """On a mesh with a seq axis (tokens in zigzag order) local layers run ring attention with the window,
    global ones the plain ring: the logits equal one device's."""
    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.parallel.zigzag import zigzag_reorder, zigzag_restore

    make_model("Gemma3ForCausalLM", text_config(kv_heads=2), tmp_path)
    model = load_pretrained(tmp_path)
    ids = jnp.asarray(np.random.default_rng(6).integers(3, VOCAB, (2, 32)), jnp.int32)
    seg = jnp.asarray(np.repeat([[1] * 20 + [2] * 12], 2, axis=0), jnp.int32)
    pos = jnp.concatenate([jnp.arange(20), jnp.arange(12)])[None].repeat(2, 0).astype(jnp.int32)
    forward = jax.jit(lambda m, i, p, s: m(i, p, s))
    want = np.asarray(forward(model, ids, pos, seg))
    mesh = make_mesh(data=2, fsdp=1, seq=4)
    sharded = load_pretrained(tmp_path, mesh=mesh)
    with jax.set_mesh(mesh):
        got = forward(sharded, *(zigzag_reorder(x, 4) for x in (ids, pos, seg)))
    assert rel_err(zigzag_restore(np.asarray(got), 4), want) <= TOL


# Gemma 3 configs as released (google/gemma-3-1b-it, google/gemma-3-4b-it, config.json as of transformers 4.50):
# sparse text_config, 4.x RoPE keys, sliding_window_pattern instead of layer_types.
GEMMA3_1B = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
             "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
             "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
             "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
             "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
             "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
             "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
             "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 262144}
GEMMA3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
             "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
             "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
             "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                             "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                             "sliding_window": 1024},
             "torch_dtype": "bfloat16",
             "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                               "model_type": "siglip_vision_model", "num_attention_heads": 16,
                               "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}}


@pytest.mark.parametrize("name", ["1b", "4b"])
def test_released_configs_read_as_transformers_reads_them(name):
    from longrm_jax.models.config import from_hf_config

    raw = GEMMA3_1B if name == "1b" else GEMMA3_4B
    cfg = from_hf_config(raw)
    hf = transformers.Gemma3TextConfig(**raw) if name == "1b" else transformers.Gemma3Config(**raw).text_config
    assert list(cfg.layer_types) == hf.layer_types and cfg.sliding_window == hf.sliding_window
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.vocab_size)
    assert cfg.query_pre_attn_scalar == hf.query_pre_attn_scalar and cfg.tie_word_embeddings
    glob, local = hf.rope_parameters["full_attention"], hf.rope_parameters["sliding_attention"]
    assert (cfg.rope_type, cfg.rope_theta, cfg.rope_scaling_dict.get("factor")) == (
        glob["rope_type"], glob["rope_theta"], glob.get("factor"))
    assert cfg.local_rope_theta == local["rope_theta"] == 10000 and cfg.eos_token_id == (1, 106)
    assert sum(cfg.local_layers) == cfg.num_layers - cfg.num_layers // 6  # five local layers per global one
    if name == "4b":  # Gemma3ForConditionalGeneration's head never caps its logits (only Gemma3ForCausalLM's does)
        capped = {**raw, "text_config": {**raw["text_config"], "final_logit_softcapping": 30.0}}
        assert from_hf_config(capped).final_logit_softcapping is None


def test_causal_checkpoint_as_score_head_and_other_prefix(tmp_path):
    """A Gemma3ForCausalLM loaded as a reward model (DisRM): tied, so no lm_head to drop; a new score head on
    HF's last hidden states. And the multimodal layout's other prefix (model.language_model.*) loads too."""
    from safetensors.torch import load_file, save_file

    ref = make_model("Gemma3ForConditionalGeneration", multimodal_config(kv_heads=2), tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    renamed = {k.replace("language_model.model.", "model.language_model.")
               .replace("vision_tower.", "model.vision_tower."): v for k, v in weights.items()}
    assert any(k.startswith("model.language_model.") for k in renamed)
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = load_pretrained(tmp_path, head="classifier")
    assert type(model).__name__ == "SequenceClassifier" and model.config.num_labels == 1
    ids = np.random.default_rng(7).integers(3, VOCAB, (1, 30))
    with torch.no_grad():
        hidden = ref.model.language_model(torch.tensor(ids)).last_hidden_state.numpy()
    assert rel_err(model.hidden_states(jnp.asarray(ids, jnp.int32)), hidden) <= TOL


@pytest.mark.parametrize("name", ["1b", "4b"])
def test_exported_config_reads_back_the_same(name):
    """to_hf_config then from_hf_config gives the same ModelConfig (layer kinds, both RoPEs, Gemma's flags); a
    multimodal source exports as a text-only Gemma3ForCausalLM config without its vision keys."""
    from longrm_jax.models.config import from_hf_config, to_hf_config

    raw = GEMMA3_1B if name == "1b" else GEMMA3_4B
    cfg = from_hf_config(raw)
    out = to_hf_config(cfg, base=raw)
    assert out["architectures"] == ["Gemma3ForCausalLM"] and out["model_type"] == "gemma3_text"
    assert "vision_config" not in out and "text_config" not in out and out["sliding_window_pattern"] == 6
    assert from_hf_config(out) == cfg
    assert list(transformers.Gemma3TextConfig(**out).layer_types) == list(cfg.layer_types)
