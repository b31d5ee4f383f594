"""How many continuous-batching slots each length bucket gets, from the model's shapes and the device's memory.

Pure arithmetic on a model config and byte counts (no device, no model): the evaluator plans its pools with it
(:mod:`longrm_jax.evaluation.grm.continuous`), the run estimate prices them (:mod:`longrm_jax.evaluation.grm.estimate`),
and a CPU test checks the plan of Qwen3-8B against an H100's and an H200's memory.

Budget of a pool of ``columns`` cache columns per slot on ``memory_bytes`` (a device's ``bytes_limit``):

    MEMORY_FRACTION x memory - weights - prefill - admission = room; slots = room // per_slot

* weights: every parameter as stored;
* prefill: one prompt of ``columns`` tokens at most (prompts are prefilled one at a time, straight into their
  slot's cache row): the layer activations it keeps live, ~(4 hidden + q/k/v width) values per token plus
  3 intermediate values per token of one MLP chunk (``config.mlp_chunk_tokens``, set by
  ``generation.prepare_for_decoding``; the whole prompt when 0);
* admission: the slot row's positions and segment ids, padded and rolled (a few int32 rows);
* per slot: its cache (:func:`kv_cache_bytes`: K and V of every global layer per column, of every
  sliding-window layer per slot of its ring, plus the position and segment id of each) and the fp32 logits of
  a step (three vocab-wide rows).

A pool never gets more slots than the power of two at or above its prompt count (bounded shapes: few
compiles per run), nor more than :data:`MAX_SLOTS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from longrm_jax.data.packing import bucket_for
from longrm_jax.evaluation.batching import bucket_lengths
from longrm_jax.models.cache import ring_slots
from longrm_jax.parallel.topology import GiB

# Of the device's limit: XLA's own workspace and fragmentation take the rest. Training keeps a fixed margin instead
# (parallel.topology.GPU_RUNTIME_HEADROOM off the limit), measured against one compiled program's own figure; the
# slot pool here is sized by arithmetic over many bucket programs, so it keeps a margin that grows with the card.
MEMORY_FRACTION = 0.9
FALLBACK_SLOTS = 4  # when neither the device nor the caller states a memory size (e.g. the CPU backend)
MAX_SLOTS = 256


def kv_bytes_per_column(config) -> int:
    """Cache bytes of one token of one slot at full length: K and V of every layer in the compute dtype, plus
    its position and segment id (int32 each). Qwen3-8B in bf16: 147,464 bytes (144 KiB)."""
    item = np.dtype(config.compute_dtype).itemsize
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * item + 8


def kv_cache_bytes(config, columns: float, window_rings: bool = True) -> float:
    """Cache bytes of one slot of ``columns`` columns, as ``init_cache`` allocates it: the global layers' K and V
    at every column, the sliding-window layers' in rings of their window (``models.cache.ring_slots``; at full
    length where ``window_rings`` is off or a ring would not be shorter), plus an int32 position and segment id
    per column and per ring slot (an int for a whole number of columns; estimates pass mean fills). Gemma 3 12B
    in bf16 at 131,072 + 2,048 columns: 8 of its 48 layers at full length, 40 in rings of 1,024: 8.44 GiB
    instead of 48.75 (-82.7%)."""
    ring = ring_slots(config.sliding_window, columns) if window_rings and any(config.local_layers) else None
    if ring is None:
        return columns * kv_bytes_per_column(config)
    item = np.dtype(config.compute_dtype).itemsize
    per_layer_slot = 2 * config.num_kv_heads * config.head_dim * item
    num_local = sum(config.local_layers)
    return columns * ((config.num_layers - num_local) * per_layer_slot + 8) + ring * (num_local * per_layer_slot + 8)


def plan_slots(config, weight_bytes: int, columns: int, memory_bytes: int, window_rings: bool = True) -> dict:
    """Byte budget of a slot pool of ``columns`` cache columns per slot (module docstring); ``slots`` >= 1,
    ``fits`` False when not even one slot fits (the pool then tries one)."""
    item = np.dtype(config.compute_dtype).itemsize
    mlp_tokens = min(columns, config.mlp_chunk_tokens or columns)
    width = 4 * config.hidden_size + (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    prefill = item * (columns * width + mlp_tokens * 3 * config.intermediate_size)
    admission = 4 * columns * 8
    per_slot = kv_cache_bytes(config, columns, window_rings) + 3 * 4 * config.vocab_size
    free = int(MEMORY_FRACTION * memory_bytes) - weight_bytes - prefill - admission
    slots = int(max(1, min(MAX_SLOTS, free // per_slot)))
    return dict(memory_bytes=int(memory_bytes), weights=int(weight_bytes), prefill=int(prefill),
                admission=int(admission), per_slot=int(per_slot), free=int(free), columns=int(columns),
                slots=slots, fits=free >= per_slot)


def describe_plan(plan: dict) -> str:
    """Why a pool has its slots, in one line: memory left after the fixed costs vs one slot's bytes."""
    left = (f"{plan['memory_bytes'] / GiB:.1f} GiB x {MEMORY_FRACTION:.2f} - weights {plan['weights'] / GiB:.2f}"
            f" - prefill {plan['prefill'] / GiB:.2f} - admission {plan['admission'] / GiB:.2f}"
            f" = {plan['free'] / GiB:.2f} GiB for slots of {plan['per_slot'] / GiB:.3f} GiB")
    if not plan["fits"]:
        return left + ": not even one fits, trying one"
    return left + (f": {plan['slots']} (the {MAX_SLOTS}-slot cap)" if plan["slots"] == MAX_SLOTS
                   else f": {plan['slots']}")


@dataclasses.dataclass
class Pool:
    """One length bucket's slot pool: ``items`` (prompt indices, longest first), ``slots`` it runs with,
    ``allowed`` (what memory or --batch-size allow) and ``why`` (how ``allowed`` was decided)."""

    bucket: int
    items: list[int]
    slots: int
    allowed: int
    why: str


def plan_pools(lengths: Sequence[int], max_new: int,
               slots_for: Callable[[int], tuple[int, str]]) -> list[Pool]:
    """The pools of a run of prompts of ``lengths``, longest bucket first; ``slots_for(columns)`` returns
    (slots memory or the caller allow, why)."""
    if not len(lengths):
        return []
    buckets = bucket_lengths(max(lengths))
    members: dict[int, list[int]] = {}
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        members.setdefault(bucket_for(lengths[index], buckets), []).append(index)
    pools = []
    for bucket in sorted(members, reverse=True):
        items = members[bucket]
        allowed, why = slots_for(bucket + max_new)
        # Fewer prompts than slots: a power of two >= their count (bounded shapes, so few compiles per run).
        slots = max(1, min(allowed, 1 << (len(items) - 1).bit_length()))
        pools.append(Pool(bucket, items, slots, allowed, why))
    return pools


def format_pool_plan(pools: Sequence[Pool], max_new: int) -> str:
    """The run's slot plan, one line per bucket: bucket -> prompts -> slots -> why."""
    lines = [f"slot plan ({sum(len(p.items) for p in pools)} prompts, up to {max_new} new tokens each):"]
    for pool in pools:
        capped = (f" (capped from {pool.allowed}: {len(pool.items)} prompts)" if pool.slots < pool.allowed else "")
        lines.append(f"  bucket {pool.bucket:>7} ({pool.bucket + max_new} cache columns): {len(pool.items):>5} "
                     f"prompts on {pool.slots:>3} slots{capped}; {pool.why}")
    return "\n".join(lines)
