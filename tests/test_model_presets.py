"""training.model_setup.PRESETS (issue 43): every preset builds a ModelConfig; the shapes of the new bases are what
their HF configs say (Gemma 3 12B read through models.config from the config.json under docs/results, the others
against transformers' config classes filled with the checkpoints' keys); the evaluator's --help names each preset
that --compile-only takes."""

import dataclasses
import json
import os

import pytest

from longrm_jax.models import ModelConfig
from longrm_jax.models.config import from_hf_config
from longrm_jax.training.model_setup import PRESETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMERICS = {"num_labels", "param_dtype"}  # HF's default of 2 labels; the checkpoint's bf16 storage


def _same(preset: str, hf: dict) -> None:
    ours, theirs = ModelConfig(**PRESETS[preset]), from_hf_config(hf)
    diff = {f.name: (getattr(ours, f.name), getattr(theirs, f.name)) for f in dataclasses.fields(ModelConfig)
            if f.name not in NUMERICS and getattr(ours, f.name) != getattr(theirs, f.name)}
    assert not diff, diff


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds(name):
    cfg = ModelConfig(**({"vocab_size": 256} | PRESETS[name]))
    assert cfg.family in name.replace("qwen25", "qwen2")


def test_gemma3_12b_is_the_checkpoints_text_config():
    with open(os.path.join(ROOT, "docs", "results", "gemma3_12b", "config.json")) as f:
        _same("gemma3_12b", json.load(f))
    cfg = ModelConfig(**PRESETS["gemma3_12b"])
    assert sum(cfg.local_layers) == 40 and cfg.sliding_window == 1024 and cfg.rope_scaling_dict == {"factor": 8.0}


def test_the_other_new_bases_are_their_config_json():
    base = dict(rms_norm_eps=1e-5, rope_theta=1e6, bos_token_id=1, eos_token_id=2, sliding_window=None,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336)
    _same("mistral_7b", dict(base, architectures=["MistralForCausalLM"], vocab_size=32768, hidden_size=4096,
                             num_hidden_layers=32, max_position_embeddings=32768))
    _same("mistral_nemo_12b", dict(base, architectures=["MistralForCausalLM"], vocab_size=131072, hidden_size=5120,
                                   num_hidden_layers=40, max_position_embeddings=128000))
    assert 5120 // 32 != PRESETS["mistral_nemo_12b"]["head_dim"]
    _same("qwen25_7b", dict(architectures=["Qwen2ForCausalLM"], vocab_size=152064, hidden_size=3584,
                            intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                            num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=131072,
                            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                            use_sliding_window=False, sliding_window=131072, max_window_layers=28,
                            bos_token_id=151643, eos_token_id=151645, pad_token_id=151643,
                            tie_word_embeddings=False))
    _same("gemma3_1b", dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=262144,
                            hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
                            num_key_value_heads=1, head_dim=256, sliding_window=512, sliding_window_pattern=6,
                            rope_scaling=None, max_position_embeddings=32768, eos_token_id=[1, 106]))


def test_tiny_gemma3_has_local_and_global_layers():
    cfg = ModelConfig(**({"vocab_size": 256} | PRESETS["tiny_gemma3"]))
    assert cfg.layer_types == ("sliding_attention", "full_attention") and cfg.sliding_window == 64


def test_evaluate_help_names_every_preset_with_a_vocabulary():
    from longrm_jax.evaluate import build_parser

    helptext = " ".join(build_parser().format_help().split())
    for name, fields in PRESETS.items():
        assert ("vocab_size" in fields) == (name in helptext), name
