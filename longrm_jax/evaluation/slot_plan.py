"""How many continuous-batching slots each length bucket gets, from the model's shapes and the device's memory.

Pure arithmetic on a model config and byte counts (no device, no model): the evaluator plans its pools with it
(:mod:`longrm_jax.evaluation.continuous`), the run estimate prices them (:mod:`longrm_jax.evaluation.estimate`),
and a CPU test checks the plan of Qwen3-8B against an H100's and an H200's memory.

Budget of a pool of ``columns`` cache columns per slot on ``memory_bytes`` (a device's ``bytes_limit``):

    MEMORY_FRACTION x memory - weights - prefill - admission = room; slots = room // per_slot

* weights: every parameter as stored;
* prefill: one prompt of ``columns`` tokens at most (prompts are prefilled one at a time, straight into their
  slot's cache row): the layer activations it keeps live, ~(4 hidden + q/k/v width) values per token plus
  3 intermediate values per token of one MLP chunk (``config.mlp_chunk_tokens``, set by
  ``generation.prepare_for_decoding``; the whole prompt when 0);
* admission: the slot row's positions and segment ids, padded and rolled (a few int32 rows);
* per slot: its cache columns (K and V of every layer, plus the position and segment id of each column) and
  the fp32 logits of a step (three vocab-wide rows).

A pool never gets more slots than the power of two at or above its prompt count (bounded shapes: few
compiles per run), nor more than :data:`MAX_SLOTS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from longrm_jax.data.packing import bucket_for
from longrm_jax.evaluation.batching import bucket_lengths

MEMORY_FRACTION = 0.9  # of the device's limit: XLA's own workspace and fragmentation take the rest
FALLBACK_SLOTS = 4  # when neither the device nor the caller states a memory size (e.g. the CPU backend)
MAX_SLOTS = 256
GIB = 1 << 30


def kv_bytes_per_column(config) -> int:
    """Cache bytes of one token of one slot: K and V of every layer in the compute dtype, plus its position and
    segment id (int32 each). Qwen3-8B in bf16: 147,464 bytes (144 KiB)."""
    item = np.dtype(config.compute_dtype).itemsize
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * item + 8


def plan_slots(config, weight_bytes: int, columns: int, memory_bytes: int) -> dict:
    """Byte budget of a slot pool of ``columns`` cache columns per slot (module docstring); ``slots`` >= 1,
    ``fits`` False when not even one slot fits (the pool then tries one)."""
    item = np.dtype(config.compute_dtype).itemsize
    per_column = kv_bytes_per_column(config)
    mlp_tokens = min(columns, config.mlp_chunk_tokens or columns)
    width = 4 * config.hidden_size + (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    prefill = item * (columns * width + mlp_tokens * 3 * config.intermediate_size)
    admission = 4 * columns * 8
    per_slot = columns * per_column + 3 * 4 * config.vocab_size
    free = int(MEMORY_FRACTION * memory_bytes) - weight_bytes - prefill - admission
    slots = int(max(1, min(MAX_SLOTS, free // per_slot)))
    return dict(memory_bytes=int(memory_bytes), weights=int(weight_bytes), prefill=int(prefill),
                admission=int(admission), per_slot=int(per_slot), free=int(free), columns=int(columns),
                slots=slots, fits=free >= per_slot)


def describe_plan(plan: dict) -> str:
    """Why a pool has its slots, in one line: memory left after the fixed costs vs one slot's bytes."""
    left = (f"{plan['memory_bytes'] / GIB:.1f} GiB x {MEMORY_FRACTION:.2f} - weights {plan['weights'] / GIB:.2f}"
            f" - prefill {plan['prefill'] / GIB:.2f} - admission {plan['admission'] / GIB:.2f}"
            f" = {plan['free'] / GIB:.2f} GiB for slots of {plan['per_slot'] / GIB:.3f} GiB")
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
