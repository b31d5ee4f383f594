"""Preallocated KV cache for generation, with static shapes so a jitted decode loop compiles once.

Every slot remembers the position and segment id of the token written there, and attention masks by them:
a query (position p, segment s) sees slot j iff ``segment[j] == s != 0`` and ``position[j] <= p``. Unwritten
slots keep segment 0, so the rule needs no notion of "written so far": it covers plain prompts, right-padded
prompts (pads carry segment 0, so real tokens never see them, and each row decodes on from its own length),
left-padded ones, and caches used as ring buffers whose rows start at different slots (continuous batching:
the slot order of a row does not matter, only the positions and segments recorded in it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """k, v [L, B, S, K, H]; positions, segment_ids int32 [B, S] (segment 0 = padding / unused);
    index int32 scalar: number of slots written (the next write goes to ``index``)."""

    k: jax.Array
    v: jax.Array
    positions: jax.Array
    segment_ids: jax.Array
    index: jax.Array

    @classmethod
    def create(cls, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int, dtype):
        shape = (num_layers, batch, max_len, num_kv_heads, head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            positions=jnp.zeros((batch, max_len), jnp.int32),
            segment_ids=jnp.zeros((batch, max_len), jnp.int32),
            index=jnp.zeros((), jnp.int32),
        )

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def write_meta(self, positions_bt: jax.Array, segment_ids_bt: jax.Array) -> KVCache:
        """Record positions / segment ids of the T new tokens at slots [index, index + T)."""
        start = (jnp.zeros((), jnp.int32), self.index)
        return dataclasses.replace(
            self,
            positions=jax.lax.dynamic_update_slice(self.positions, positions_bt.astype(jnp.int32), start),
            segment_ids=jax.lax.dynamic_update_slice(self.segment_ids, segment_ids_bt.astype(jnp.int32), start),
        )

    def attention_mask(self, positions_bt: jax.Array, segment_ids_bt: jax.Array, num_new: int,
                       window: int | None = None) -> jax.Array:
        """[B, T, S] mask for T new queries, after ``write_meta`` for them; ``window``: a sliding-window layer's,
        which also hides slots ``window`` or more positions behind the query (HF: i - W < j <= i)."""
        del num_new  # kept for callers; written slots are told apart by their nonzero segment ids
        cached = self.segment_ids[:, None, :]
        same_segment = (segment_ids_bt[:, :, None] == cached) & (cached != 0)
        not_future = self.positions[:, None, :] <= positions_bt[:, :, None]
        if window is not None:
            not_future = not_future & (self.positions[:, None, :] > positions_bt[:, :, None] - window)
        return same_segment & not_future

