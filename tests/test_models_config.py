"""ModelConfig <-> HF config.json, and RoPE tables against transformers' own ROPE_INIT_FUNCTIONS."""

import numpy as np
import pytest

from longrm_jax.models.config import ModelConfig, from_hf_config, to_hf_config
from longrm_jax.models.rope import rope_parameters

LLAMA_31_8B = {  # transformers 4.x style (the published config.json)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
}
QWEN3_8B_YARN = {  # transformers 5.x style
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                        "original_max_position_embeddings": 32768},
    "dtype": "bfloat16", "eos_token_id": 151645, "pad_token_id": 151643,
}


def test_reads_both_key_sets():
    llama = from_hf_config(LLAMA_31_8B)
    assert (llama.family, llama.head, llama.rope_type, llama.rope_theta) == ("llama", "causal_lm", "llama3", 5e5)
    assert llama.head_dim == 128 and llama.rope_scaling_dict["original_max_position_embeddings"] == 8192
    assert llama.param_dtype == "bfloat16" and llama.eos_token_id == (128001, 128008, 128009)
    qwen = from_hf_config(QWEN3_8B_YARN)
    assert (qwen.family, qwen.qk_norm, qwen.rope_type, qwen.rope_theta) == ("qwen3", True, "yarn", 1e6)
    assert qwen.rope_scaling_dict == {"factor": 4.0, "original_max_position_embeddings": 32768}
    legacy = dict(LLAMA_31_8B, rope_scaling={"type": "linear", "factor": 2.0})  # oldest spelling: "type"
    assert from_hf_config(legacy).rope_type == "linear"
    assert from_hf_config(dict(LLAMA_31_8B, rope_scaling=None)).rope_type == "default"


@pytest.mark.parametrize("hf", [LLAMA_31_8B, QWEN3_8B_YARN], ids=["llama", "qwen3"])
def test_round_trip_writes_both_key_sets(hf):
    cfg = from_hf_config(hf)
    out = to_hf_config(cfg)
    assert out["rope_theta"] == cfg.rope_theta
    assert out["rope_parameters"]["rope_type"] == cfg.rope_type == out["rope_scaling"]["rope_type"]
    assert out["torch_dtype"] == out["dtype"] == "bfloat16"
    assert from_hf_config(out) == cfg
    assert from_hf_config(out, head="classifier").hf_architecture.endswith("ForSequenceClassification")


def test_unknown_architecture_and_rope_type_are_named():
    with pytest.raises(ValueError, match=r"Phi3ForCausalLM.*supported.*LlamaForCausalLM"):
        from_hf_config(dict(LLAMA_31_8B, architectures=["Phi3ForCausalLM"]))
    with pytest.raises(ValueError, match=r"'dynamic'.*supported.*yarn"):
        from_hf_config(dict(LLAMA_31_8B, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    with pytest.raises(ValueError, match="low_freq_factor"):
        from_hf_config(dict(LLAMA_31_8B, rope_scaling={"rope_type": "llama3", "factor": 8.0}))


def test_config_is_hashable_and_frozen():
    cfg = from_hf_config(QWEN3_8B_YARN)
    assert hash(cfg) == hash(from_hf_config(QWEN3_8B_YARN))
    with pytest.raises(AttributeError):
        cfg.hidden_size = 3  # type: ignore[misc]


ROPE_VARIANTS = [
    ("default", {}),
    ("linear", {"factor": 4.0}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 32768}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 32768, "truncate": False, "beta_fast": 16}),
    ("yarn", {"factor": 8.0, "original_max_position_embeddings": 4096, "attention_factor": 1.3}),
    ("yarn", {"factor": 8.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5}),
]


@pytest.mark.parametrize("rope_type,scaling", ROPE_VARIANTS)
def test_rope_tables_match_transformers(rope_type, scaling):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = dict(QWEN3_8B_YARN, rope_parameters={"rope_type": rope_type, "rope_theta": 1e6, **scaling})
    cfg = from_hf_config(hf)
    ours, ours_factor = rope_parameters(cfg)
    hf_config = transformers.Qwen3Config(**{k: v for k, v in hf.items() if k != "architectures"})
    if rope_type == "default":
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        theirs, their_factor = Qwen3RotaryEmbedding.compute_default_rope_parameters(hf_config)
    else:
        theirs, their_factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)
    assert ours_factor == pytest.approx(their_factor, rel=1e-7)


def test_yarn_uses_configured_factor_not_ratio():
    """The 4.51-4.55 trap: factor must be the configured 4, not max_pos / original (131072/32768 = 4 here,
    so use a config where the two differ)."""
    cfg = from_hf_config(dict(QWEN3_8B_YARN, max_position_embeddings=40960))
    _, attention_factor = rope_parameters(cfg)
    assert attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)


def test_model_config_rejects_bad_values():
    with pytest.raises(ValueError, match="remat"):
        ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                    head_dim=4, remat="sometimes")
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=3, num_kv_heads=2,
                    head_dim=4)
