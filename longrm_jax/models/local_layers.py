"""Sliding-window ("local") and global layers in one stacked, scanned decoder (Gemma 3: five local layers per
global one; Mistral / Qwen2 configs with a window on some or all layers).

Inside ``lax.scan`` the layer index is traced, so a layer's kind is a traced boolean: the attention call, whose
window is static (part of the attention contract, ``ops.contract.check_window``), runs under ``lax.cond`` with
one branch per kind, and per-layer arrays (RoPE tables, cache masks) are selected with ``jnp.where``. Unrolled
layers (a Python index) and stacks of one kind decide statically, with no ``cond`` at all.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from longrm_jax.models.config import ModelConfig
from longrm_jax.models.rope import compute_rope_parameters, rope_cos_sin, rope_parameters


def is_local(cfg: ModelConfig, i):
    """Whether layer ``i`` attends through the sliding window: a Python bool when that is known statically (a
    Python index, or every layer of one kind), else a traced bool."""
    flags = cfg.local_layers
    if all(flags) or not any(flags):
        return bool(flags[0])
    if isinstance(i, int):
        return flags[i]
    return jnp.asarray(flags)[i]


def pick(local, when_local, when_global):
    """``when_local`` or ``when_global`` (pytrees of like arrays) for a layer of kind ``local``."""
    if isinstance(local, bool):
        return when_local if local else when_global
    return jax.tree.map(lambda a, b: jnp.where(local, a, b), when_local, when_global)


def by_kind(local, local_fn, global_fn, *operands):
    """``local_fn(*operands)`` on a local layer, ``global_fn(*operands)`` on a global one (``lax.cond`` when
    the kind is traced: only the layer's own branch runs)."""
    if isinstance(local, bool):
        return (local_fn if local else global_fn)(*operands)
    return jax.lax.cond(local, local_fn, global_fn, *operands)



@functools.lru_cache(maxsize=32)
def _rope_tables(cfg: ModelConfig):
    return rope_parameters(cfg)


@functools.lru_cache(maxsize=32)
def _local_rope_tables(cfg: ModelConfig):
    """The sliding layers' RoPE (default type at ``local_rope_theta``), or None where they share the global one."""
    if cfg.local_rope_theta is None or not any(cfg.local_layers):
        return None
    return compute_rope_parameters("default", cfg.local_rope_theta, cfg.head_dim, {})


def layer_rope(cfg: ModelConfig, positions, dtype):
    """(global cos/sin, local cos/sin or None) [B, T, head_dim] for ``positions``."""
    inv_freq, attention_factor = _rope_tables(cfg)
    rope = rope_cos_sin(positions, inv_freq, attention_factor, dtype)
    local = _local_rope_tables(cfg)
    return rope, None if local is None else rope_cos_sin(positions, *local, dtype)


def rope_of(local, global_rope, local_rope):
    """The cos/sin pair of a layer of kind ``local``."""
    return global_rope if local_rope is None else pick(local, local_rope, global_rope)
