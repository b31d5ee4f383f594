"""Preallocated KV cache for generation, with static shapes so a jitted decode loop compiles once.

Every slot remembers the position and segment id of the token written there, and attention masks by them:
a query (position p, segment s) sees slot j iff ``segment[j] == s != 0`` and ``position[j] <= p``. Unwritten
slots keep segment 0, so the rule needs no notion of "written so far": it covers plain prompts, right-padded
prompts (pads carry segment 0, so real tokens never see them, and each row decodes on from its own length),
left-padded ones, and caches used as ring buffers whose rows start at different slots (continuous batching:
the slot order of a row does not matter, only the positions and segments recorded in it).

Sliding-window ("local") layers may keep only a ring of :func:`ring_slots` slots per row (``local_*`` fields;
``models.window_cache`` writes and reads them): a token at position p goes to slot ``p % ring``, so a row's
ring holds its latest ``ring`` >= window positions, all a window query can see. The full-length ``k`` / ``v``
then stack the global layers only. A cache without ``local_k`` stacks every layer at full length.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from longrm_jax.ops.contract import PAD_POSITION

# A local layer's ring is its window rounded up to a multiple of this: the decode kernel's smallest block of
# slots (ops.decode_attention), so a ring of Gemma 3's 1024 or Mistral's 4096 slots stays exactly the window.
RING_MULTIPLE = 16


def ring_slots(window: int | None, max_len: int) -> int | None:
    """Slots of a local layer's ring for a cache of ``max_len`` slots; None where a ring would save nothing (no
    window, or the rounded window is not shorter than the cache: local layers then keep every slot)."""
    if not window:
        return None
    ring = RING_MULTIPLE * math.ceil(window / RING_MULTIPLE)
    return ring if ring < max_len else None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """k, v [L, B, S, K, H] (L: every layer, or the global layers of a split cache); positions, segment_ids
    int32 [B, S] (segment 0 = padding / unused); index int32 scalar: number of slots written (the next write
    goes to ``index``). Split caches only: local_k, local_v [L_local, B, R, K, H] and local_positions,
    local_segment_ids int32 [B, R], the local layers' rings of R = :func:`ring_slots` slots."""

    k: jax.Array
    v: jax.Array
    positions: jax.Array
    segment_ids: jax.Array
    index: jax.Array
    local_k: jax.Array | None = None
    local_v: jax.Array | None = None
    local_positions: jax.Array | None = None
    local_segment_ids: jax.Array | None = None

    @classmethod
    def create(cls, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int, dtype,
               local_layers: tuple[bool, ...] = (), window: int | None = None):
        """Empty cache; ``local_layers`` (one flag per layer) and ``window``: local layers get rings of
        :func:`ring_slots` slots where that is shorter than ``max_len``."""
        ring = ring_slots(window, max_len) if any(local_layers) else None
        num_local = sum(local_layers) if ring else 0

        def kv(layers, slots):
            return jnp.zeros((layers, batch, slots, num_kv_heads, head_dim), dtype)

        def meta(slots):
            return jnp.zeros((batch, slots), jnp.int32)

        local = {} if not ring else dict(local_k=kv(num_local, ring), local_v=kv(num_local, ring),
                                         local_positions=meta(ring), local_segment_ids=meta(ring))
        return cls(k=kv(num_layers - num_local, max_len), v=kv(num_layers - num_local, max_len),
                   positions=meta(max_len), segment_ids=meta(max_len), index=jnp.zeros((), jnp.int32), **local)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def ring(self) -> int | None:
        """Slots of the local layers' rings; None for a cache that keeps every layer at full length."""
        return None if self.local_k is None else self.local_k.shape[2]

    def write_meta(self, positions_bt: jax.Array, segment_ids_bt: jax.Array) -> KVCache:
        """Record positions / segment ids of the T new tokens at slots [index, index + T)."""
        start = (jnp.zeros((), jnp.int32), self.index)
        return dataclasses.replace(
            self,
            positions=jax.lax.dynamic_update_slice(self.positions, positions_bt.astype(jnp.int32), start),
            segment_ids=jax.lax.dynamic_update_slice(self.segment_ids, segment_ids_bt.astype(jnp.int32), start),
        )

    def write_ring_meta(self, positions_bt: jax.Array, segment_ids_bt: jax.Array, slots_bt: jax.Array,
                        row: jax.Array | None = None) -> KVCache:
        """Record the new tokens' positions / segment ids in the rings at ``slots_bt`` (:func:`ring_targets`;
        out-of-range slots are not written). ``row``: the tokens are one prompt (B = 1) admitted to that row,
        whose earlier occupant's ring entries are cleared first."""
        pos, seg = self.local_positions, self.local_segment_ids
        if row is None:
            rows, slots, new_pos, new_seg = jnp.arange(pos.shape[0])[:, None], slots_bt, positions_bt, segment_ids_bt
        else:
            pos, seg = pos.at[row].set(0), seg.at[row].set(0)
            rows, slots, new_pos, new_seg = row, slots_bt[0], positions_bt[0], segment_ids_bt[0]
        return dataclasses.replace(
            self, local_positions=pos.at[rows, slots].set(new_pos.astype(jnp.int32), mode="drop"),
            local_segment_ids=seg.at[rows, slots].set(new_seg.astype(jnp.int32), mode="drop"))

    def attention_mask(self, positions_bt: jax.Array, segment_ids_bt: jax.Array, num_new: int,
                       window: int | None = None, ring: bool = False) -> jax.Array:
        """[B, T, S] mask for T new queries, after ``write_meta`` for them; ``window``: a sliding-window layer's,
        which also hides slots ``window`` or more positions behind the query (HF: i - W < j <= i); ``ring``:
        over the local layers' rings ([B, T, R]) instead of the full-length slots."""
        del num_new  # kept for callers; written slots are told apart by their nonzero segment ids
        positions, segments = ((self.local_positions, self.local_segment_ids) if ring
                               else (self.positions, self.segment_ids))
        cached = segments[:, None, :]
        same_segment = (segment_ids_bt[:, :, None] == cached) & (cached != 0)
        not_future = positions[:, None, :] <= positions_bt[:, :, None]
        if window is not None:
            not_future = not_future & (positions[:, None, :] > positions_bt[:, :, None] - window)
        return same_segment & not_future


def ring_targets(positions_bt: jax.Array, segment_ids_bt: jax.Array, ring: int) -> jax.Array:
    """int32 [B, T]: the ring slot of each new token (``position % ring``), or ``ring`` (out of range: not
    written) for padding (segment 0 or ``PAD_POSITION``) and for tokens ``ring`` or more positions behind their
    row's latest new token, whose slot a later token of the same call takes. One sequence per row: the kept
    tokens' positions are then distinct and less than ``ring`` apart, so their slots are too."""
    real = (segment_ids_bt != 0) & (positions_bt < PAD_POSITION)
    latest = jnp.max(jnp.where(real, positions_bt, -1), axis=1, keepdims=True)
    kept = real & (positions_bt > latest - ring)
    return jnp.where(kept, positions_bt % ring, ring).astype(jnp.int32)
