"""Rotary position embeddings with the exact semantics of transformers >= 4.56.

Frequencies are computed once, on the host in float64 -> float32 numpy, following
``transformers.modeling_rope_utils`` (types ``default``, ``linear``, ``llama3``, ``yarn``). Note the YaRN trap
(docs/upstream.md, "Architectures and HF transformers parity"): transformers 4.51-4.55 replaced the configured factor by
max_position_embeddings / original_max_position_embeddings; 4.56+ uses the configured ``factor``, as we do.

cos/sin are computed in float32 from float32 positions (as HF does), scaled by the attention factor, then
cast to the activations' dtype before the rotate-half product (HF order, so bf16 runs match HF's bf16 runs).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from longrm_jax.models.config import SUPPORTED_ROPE_TYPES, ModelConfig


def _default_inv_freq(base: float, dim: int) -> np.ndarray:
    # HF: 1 / base ** (arange(0, dim, 2).float() / dim), computed in float32 torch.
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (1.0 / (np.float32(base) ** exponent)).astype(np.float32)


def rope_parameters(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """(inverse frequencies float32 [head_dim // 2], attention factor) for ``cfg``'s RoPE type."""
    return compute_rope_parameters(
        cfg.rope_type, cfg.rope_theta, cfg.head_dim, cfg.rope_scaling_dict, cfg.max_position_embeddings
    )


def compute_rope_parameters(
    rope_type: str, theta: float, dim: int, scaling: dict, max_position_embeddings: int | None = None
) -> tuple[np.ndarray, float]:
    """Inverse frequencies and the cos/sin multiplier, as ``transformers.ROPE_INIT_FUNCTIONS[rope_type]``."""
    if rope_type == "default":
        return _default_inv_freq(theta, dim), 1.0
    if rope_type == "linear":
        return (_default_inv_freq(theta, dim) / np.float32(scaling["factor"])).astype(np.float32), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(theta, dim, scaling), 1.0
    if rope_type == "yarn":
        return _yarn(theta, dim, scaling, max_position_embeddings)
    raise ValueError(f"unknown RoPE type {rope_type!r}; supported: {list(SUPPORTED_ROPE_TYPES)}")


def _llama3_inv_freq(theta: float, dim: int, scaling: dict) -> np.ndarray:
    inv_freq = _default_inv_freq(theta, dim)
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    # Same float32 arithmetic order as HF (torch promotes python scalars to the tensor's float32).
    wavelen = (np.float32(2 * math.pi) / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq).astype(np.float32)
    smooth = ((np.float32(old_context_len) / wavelen - np.float32(low_freq_factor))
              / np.float32(high_freq_factor - low_freq_factor)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def _yarn(theta: float, dim: int, scaling: dict, max_position_embeddings: int | None) -> tuple[np.ndarray, float]:
    original_max = scaling.get("original_max_position_embeddings") or max_position_embeddings
    factor = scaling.get("factor")
    if factor is None:  # DeepSeek-V3 style configs; Llama / Qwen3 always set it.
        factor = max_position_embeddings / original_max
    attention_factor = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1
    truncate = scaling.get("truncate", True)

    def correction_dim(num_rotations):
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation_factor = (1 - ramp).astype(np.float32)
    pos_freqs = (np.float32(theta) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))).astype(np.float32)
    inv_extra = (1.0 / pos_freqs).astype(np.float32)
    inv_inter = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    inv_freq = inv_inter * (1 - extrapolation_factor) + inv_extra * extrapolation_factor
    return inv_freq.astype(np.float32), float(attention_factor)


def rope_cos_sin(positions: jnp.ndarray, inv_freq: np.ndarray, attention_factor: float, dtype):
    """cos, sin [B, T, head_dim] for int positions [B, T], computed in float32 then cast to ``dtype``."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return (jnp.cos(emb) * attention_factor).astype(dtype), (jnp.sin(emb) * attention_factor).astype(dtype)


def rotate_half(x: jnp.ndarray) -> jnp.ndarray:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x_btnh: jnp.ndarray, cos_bth: jnp.ndarray, sin_bth: jnp.ndarray) -> jnp.ndarray:
    """Rotate-half RoPE on [B, T, heads, head_dim] with cos/sin [B, T, head_dim]."""
    cos, sin = cos_bth[:, :, None, :], sin_bth[:, :, None, :]
    return x_btnh * cos + rotate_half(x_btnh) * sin
