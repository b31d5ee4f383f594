"""Gemma 3's config keys <-> ``ModelConfig`` fields (plain dicts; models.config calls these for family "gemma3").

What differs from the Llama-like families, from transformers' configuration_gemma3.py / modeling_gemma3.py:
the multimodal checkpoints (Gemma3ForConditionalGeneration, 4B-27B) keep the text model under ``text_config``
and leave most keys to Gemma3TextConfig's defaults; ``layer_types`` (or the older ``sliding_window_pattern``:
every n-th layer global) marks the sliding-window layers; RoPE is one dict per layer type in transformers 5
(``rope_parameters["full_attention"]`` / ``["sliding_attention"]``) and ``rope_theta`` / ``rope_scaling`` /
``rope_local_base_freq`` in 4.x. We export a text-only config (model_type ``gemma3_text``) with both key sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# transformers' Gemma3TextConfig defaults: the multimodal checkpoints' text_config leaves most keys to them.
GEMMA3_TEXT_DEFAULTS = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072,
    initializer_range=0.02, rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    tie_word_embeddings=True, attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
    sliding_window_pattern=6, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
    final_logit_softcapping=None, attn_logit_softcapping=None, use_bidirectional_attention=False,
)
# Keys of a multimodal Gemma3Config's top level that describe the text model (the rest is the vision side's).
_GEMMA3_TOP_KEYS = ("architectures", "dtype", "torch_dtype", "eos_token_id", "pad_token_id", "bos_token_id",
                    "id2label", "num_labels", "initializer_range")


def _optional_float(value):
    return None if value is None else float(value)


def gemma3_fields(hf: Mapping[str, Any]) -> tuple[dict, dict]:
    """(flat text config with Gemma3TextConfig's defaults, Gemma 3 ModelConfig fields + "global_rope", the
    dict :func:`_rope_from_hf` reads). Multimodal configs keep the text model under ``text_config``."""
    text = dict(GEMMA3_TEXT_DEFAULTS)
    if "text_config" in hf:
        text.update({k: hf[k] for k in _GEMMA3_TOP_KEYS if k in hf})
        text.update(hf.get("text_config") or {})
    else:
        text.update(hf)
    if text.get("use_bidirectional_attention"):
        raise ValueError("config key 'use_bidirectional_attention' is true (an encoder); only causal Gemma 3 "
                         "decoders are supported")
    if text.get("attn_logit_softcapping") is not None:
        raise ValueError(f"config key 'attn_logit_softcapping' is {text['attn_logit_softcapping']} (Gemma 2 style); "
                         "attention logit softcapping is not supported (Gemma 3 checkpoints set it null)")
    act = text.get("hidden_activation") or text.get("hidden_act")
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"config key 'hidden_activation' is {act!r}; Gemma 3 supports 'gelu_pytorch_tanh' only")
    params = text.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one RoPE dict per layer type
        global_rope = {"rope_parameters": {"rope_theta": text["rope_theta"], **params["full_attention"]}}
        local = dict(params.get("sliding_attention") or {})
    else:  # 4.x keys: rope_theta / rope_scaling for global layers, rope_local_base_freq for local ones
        global_rope = {"rope_theta": text["rope_theta"], "rope_scaling": text.get("rope_scaling")}
        local = {}
    global_rope["max_position_embeddings"] = text["max_position_embeddings"]
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise ValueError(f"sliding_attention RoPE type {local.get('rope_type')!r} is not supported (only 'default')")
    layer_types = text.get("layer_types") or [
        "sliding_attention" if (i + 1) % int(text["sliding_window_pattern"]) else "full_attention"
        for i in range(int(text["num_hidden_layers"]))]
    fields = dict(
        global_rope=global_rope, qk_norm=True, hidden_act=act, norm_unit_offset=True, sandwich_norms=True,
        embed_scale=True, query_pre_attn_scalar=float(text["query_pre_attn_scalar"]),
        # Only Gemma3ForCausalLM caps its logits; the multimodal model's head does not, whatever text_config says.
        final_logit_softcapping=None if "text_config" in hf else _optional_float(text.get("final_logit_softcapping")),
        layer_types=tuple(layer_types),
        sliding_window=text.get("sliding_window"),
        local_rope_theta=float(local.get("rope_theta", text["rope_local_base_freq"])),
    )
    return text, fields


def text_base(base: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A multimodal config's text part (``text_config`` and the top-level keys describing the text model), as
    the base of a text-only export (we export no vision tower); other configs as they are."""
    if not base or "text_config" not in base:
        return base
    return {**{k: base[k] for k in _GEMMA3_TOP_KEYS if k in base}, **(base["text_config"] or {})}


def gemma3_hf_config(out: dict, cfg) -> dict:
    """``out`` (models.config.to_hf_config's Llama-like keys for ``cfg``) turned into a text-only Gemma 3
    config that transformers 4.57 and 5.x read alike."""
    out.pop("hidden_act", None)
    out.pop("sliding_window_pattern", None)  # a base's pattern may no longer describe layer_types
    global_rope = dict(out["rope_parameters"])
    local_rope = {"rope_type": "default", "rope_theta": cfg.local_rope_theta}
    pattern = _pattern(cfg.layer_types)
    out.update(
        model_type="gemma3_text", hidden_activation=cfg.hidden_act, query_pre_attn_scalar=_int_if_whole(
            cfg.query_pre_attn_scalar), sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types),
        final_logit_softcapping=cfg.final_logit_softcapping, attn_logit_softcapping=None,
        use_bidirectional_attention=False, rope_local_base_freq=cfg.local_rope_theta,
        rope_parameters={"full_attention": global_rope, "sliding_attention": local_rope},
    )
    if pattern:
        out["sliding_window_pattern"] = pattern
    return out


def _pattern(layer_types) -> int | None:
    """n when every n-th layer is global and the others sliding (4.x's sliding_window_pattern), else None."""
    globals_at = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    n = globals_at[0] + 1 if globals_at else 0
    ok = n and all(t == ("full_attention" if (i + 1) % n == 0 else "sliding_attention")
                   for i, t in enumerate(layer_types))
    return n if ok else None


def _int_if_whole(x: float):
    return int(x) if float(x).is_integer() else x
