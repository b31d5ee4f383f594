"""Continuous batching for greedy GRM generation: a fixed number of slots that stay full.

A static batch decodes until its longest row is done, its finished rows idling. Here a finished row (stop
token or budget) is refilled at once with the next prompt, so every decode step works on a full batch.

Layout. The KV cache has ``slots`` rows of ``S = bucket + max_new_tokens`` columns, used as a ring: all rows
write the same column per decode step (a shared write pointer, so the decoder's cache update stays one
``dynamic_update_slice``), wrapping modulo ``S``. Attention masks by the position and segment id recorded in
each column, never by column order (:mod:`longrm_jax.models.cache`), so a row may start anywhere in the ring.
A prompt admitted when the pointer is at column ``c`` is prefilled on its own (batch 1, the bucket's length),
its keys/values scattered straight into the columns just before ``c`` (the row's other columns get segment 0,
hiding the previous occupant); its first decode step then writes column ``c``. A row
spans prompt + budget <= S columns, so it never overwrites itself.

Host round trips. Each jitted decode call runs up to ``chunk`` steps in a ``lax.while_loop``; it returns
early when a row finishes while prompts are still waiting (so the slot is refilled with no idle step), or
when every row is done. Prompts are grouped by length bucket (longest first): each bucket runs its own slot
pool with ``S`` sized for it, so short prompts do not pay for the longest one's cache. A live pool
(:func:`generate_live`, a server's) also admits prompts that arrive while it decodes.

Outputs are those of the static path (:class:`longrm_jax.evaluation.grm.generation.GreedyGenerator`): the
continuation without the stop token, per-token verdict-letter log-probs and whether a stop token ended it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from longrm_jax.data.packing import bucket_for
from longrm_jax.evaluation.batching import bucket_lengths
from longrm_jax.evaluation.grm.decoding import Generation, letter_logprobs
from longrm_jax.evaluation.grm.slot_plan import (  # noqa: F401 - MEMORY_FRACTION, MAX_SLOTS: re-exported
    FALLBACK_SLOTS,
    MAX_SLOTS,
    MEMORY_FRACTION,
    Pool,
    describe_plan,
    format_pool_plan,
    plan_pools,
    plan_slots,
)
from longrm_jax.evaluation.timings import Timings
from longrm_jax.ops import slow_paths
from longrm_jax.ops.contract import PAD_POSITION
from longrm_jax.parallel.target import target_of

logger = logging.getLogger(__name__)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotState:
    """Per-slot decoding state (device arrays, ``R`` slots).

    token [R]: last emitted token (fed at the next step); position [R]: its position; count [R]: tokens
    generated so far (the first comes from the prefill); budget [R]: most tokens this row may generate
    (``max_new`` unless the caller gives per-prompt budgets); done [R]: stop token emitted or budget reached;
    active [R]: the slot holds a prompt; tokens [R, max_new]; letters [R, max_new, num_letters]."""

    token: jax.Array
    position: jax.Array
    count: jax.Array
    budget: jax.Array
    done: jax.Array
    active: jax.Array
    tokens: jax.Array
    letters: jax.Array


def empty_state(slots: int, max_new: int, num_letters: int, pad_id: int) -> SlotState:
    # One buffer per field: the state is donated to the jitted admit/decode calls, and a GPU refuses to donate
    # one buffer twice (the CPU backend does not donate, so only a GPU run shows it).
    def zeros():
        return jnp.zeros((slots,), jnp.int32)

    return SlotState(token=jnp.full((slots,), pad_id, jnp.int32), position=zeros(), count=zeros(), budget=zeros(),
                     done=jnp.ones((slots,), bool), active=jnp.zeros((slots,), bool),
                     tokens=jnp.full((slots, max_new), pad_id, jnp.int32),
                     letters=jnp.zeros((slots, max_new, num_letters), jnp.float32))


def _prefill_admit(model, cache, state: SlotState, ids, positions, last_index, letter_ids, row, length, budget,
                   stop_ids, *, max_new: int, pad_id: int):
    """Prefill one prompt (``ids`` [1, P] right-padded, ``length`` real tokens) straight into slot ``row``.

    Its P columns are ring columns ``[c - length, c - length + P) mod S`` (``c`` = the write pointer): the
    prefill scatters each layer's keys and values there, in place in the donated pool (no batch-1 cache of
    the prompt beside the pool: at 128K that is one more slot's cache, 18 GiB for Qwen3-8B). The rest of the
    row gets segment 0 (its stale keys are never seen); columns past ``length`` are the prompt's pads
    (``PAD_POSITION``, never visible), which the row's decode steps overwrite.
    """
    total = cache.k.shape[2]
    span = ids.shape[1]
    shift = jnp.mod(cache.index - length, total)
    columns = jnp.mod(shift + jnp.arange(span, dtype=jnp.int32), total)
    logits, cache = model(ids, positions=positions, cache=cache, prefill=True, logits_at=last_index,
                          write_at=(row, columns))
    last = logits[:, 0]
    first = jnp.argmax(last[0], axis=-1).astype(jnp.int32)
    first_letters = letter_logprobs(last, letter_ids)[0]

    def ring_row(values):  # [1, P] -> [1, S] zero-padded, rolled to start at ``shift``
        return jnp.roll(jnp.pad(values, ((0, 0), (0, total - span))), shift, axis=1)

    zero = jnp.zeros((), jnp.int32)
    cache = dataclasses.replace(
        cache,
        positions=jax.lax.dynamic_update_slice(cache.positions, ring_row(positions.astype(jnp.int32)), (row, zero)),
        segment_ids=jax.lax.dynamic_update_slice(cache.segment_ids, ring_row(jnp.ones_like(ids, jnp.int32)),
                                                 (row, zero)))
    done = jnp.isin(first, stop_ids) | (budget <= 1)
    state = SlotState(
        token=state.token.at[row].set(first), position=state.position.at[row].set(length),
        count=state.count.at[row].set(1), budget=state.budget.at[row].set(budget),
        done=state.done.at[row].set(done),
        active=state.active.at[row].set(True),
        tokens=state.tokens.at[row].set(jnp.full((max_new,), pad_id, jnp.int32).at[0].set(first)),
        letters=state.letters.at[row].set(jnp.zeros_like(state.letters[0]).at[0].set(first_letters)))
    return cache, state


def _decode_chunk(model, cache, state: SlotState, stop_ids, letter_ids, stop_on_finish, *, chunk: int,
                  max_new: int, pad_id: int):
    """Up to ``chunk`` greedy steps for every running slot; returns (cache, state, steps run).

    Stops early when every active row is done, or (``stop_on_finish``: prompts are waiting) when some row
    finished during this call."""
    total = cache.k.shape[2]
    entry_done = state.done

    def running(s):
        return s.active & ~s.done

    def cond(carry):
        step, _, s = carry
        finished = jnp.any(s.done & ~entry_done & s.active)
        return (step < chunk) & jnp.any(running(s)) & ~(stop_on_finish & finished)

    def body(carry):
        step, cache, s = carry
        cache = dataclasses.replace(cache, index=jnp.mod(cache.index, total))
        positions = s.position[:, None]
        logits, cache = model(s.token[:, None], positions=positions, segment_ids=jnp.ones_like(positions),
                              cache=cache)
        live = running(s)
        nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        rows = jnp.arange(nxt.shape[0])
        at = jnp.where(live, s.count, max_new)  # out of range: dropped (finished / empty slots keep theirs)
        tokens = s.tokens.at[rows, at].set(nxt, mode="drop")
        letters = s.letters.at[rows, at].set(letter_logprobs(logits[:, 0], letter_ids), mode="drop")
        count = s.count + live
        done = s.done | (live & (jnp.isin(nxt, stop_ids) | (count >= s.budget)))
        s = SlotState(token=jnp.where(live, nxt, pad_id), position=s.position + live, count=count,
                      budget=s.budget, done=done, active=s.active, tokens=tokens, letters=letters)
        return step + 1, cache, s

    step, cache, state = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), cache, state))
    cache = dataclasses.replace(cache, index=jnp.mod(cache.index, total))
    return cache, state, step


@dataclasses.dataclass
class _Steps:
    """The jitted admit and decode steps of one (chunk, max_new, pad_id), kept for the process, and the shapes they
    have run: a step's first call of a shape compiles it, so its time is compile time."""
    admit: Callable
    decode: Callable
    shapes_run: set = dataclasses.field(default_factory=set)


@functools.lru_cache(maxsize=None)
def _jitted(chunk: int, max_new: int, pad_id: int, donate: bool) -> _Steps:
    # Donation lets the slot cache be updated in place (the CPU backend does not support it).
    admit = jax.jit(partial(_prefill_admit, max_new=max_new, pad_id=pad_id),
                    donate_argnums=(1, 2) if donate else ())
    decode = jax.jit(partial(_decode_chunk, chunk=chunk, max_new=max_new, pad_id=pad_id),
                     donate_argnums=(1, 2) if donate else ())
    return _Steps(admit, decode)


def continuous_generate(generator, prompts: Sequence[np.ndarray], *, slots_for, chunk: int, progress: bool,
                        desc: str, budgets: Sequence[int] | None = None,
                        on_result=None) -> tuple[list[Generation], Timings]:
    """Greedy continuations of ``prompts`` with slot refilling; ``generator`` is the calling
    ``GreedyGenerator`` (model, ids, prefill), ``slots_for(total_columns)`` -> (slots of a pool, why), see
    :func:`longrm_jax.evaluation.grm.slot_plan.plan_pools`; the plan is logged once per call.

    ``on_result(index, generation)``: called as each prompt finishes (the evaluator journals finished work).

    ``budgets``: per-prompt token budgets (each <= ``max_new_tokens``; default all ``max_new_tokens``).
    Returns (generations in ``prompts``' order, this call's :class:`Timings`: seconds and token counts per phase,
    ``compile_s``: first calls of each shape, which compile; ``prefill_s``, ``decode_s``; ``prefill_tokens``,
    ``decode_tokens``, ``decode_calls``, ``generated_tokens``: stop tokens included; ``max_slots``;
    ``slot_plan``: bucket -> slots). Timing synchronises with the device once per call, as the loop does anyway."""
    max_new = generator.max_new_tokens
    if budgets is None:
        budgets = [max_new] * len(prompts)
    if len(budgets) != len(prompts) or any(not 1 <= int(b) <= max_new for b in budgets):
        raise ValueError(f"budgets must be one per prompt, each in [1, {max_new}]")
    if not prompts:
        return [], Timings()
    pools = plan_pools([len(p) for p in prompts], max_new, slots_for)
    logger.info("%s", format_pool_plan(pools, max_new))
    bar = tqdm(total=len(prompts), unit="prompt", desc=desc, disable=not progress)
    run = _ContinuousRun(generator, prompts, budgets, int(chunk), bar, on_result)
    for pool in pools:
        run.pool(pool)
    bar.close()
    return run.results, Timings(run.clock).add({"max_slots": run.max_slots, "slot_plan": run.slot_plan})


@dataclasses.dataclass
class LiveItem:
    """A prompt that arrives while generation runs (a server's request): its token ids, its token budget
    (<= the generator's ``max_new_tokens``) and ``deliver(result)``, called once with its :class:`Generation` or
    with the exception that stopped its pool."""

    prompt: np.ndarray
    budget: int
    deliver: Callable[[object], None]
    # True once nobody waits for the result (a client that went away): its slot is freed at the next round trip.
    abandoned: Callable[[], bool] = lambda: False


class LiveSource:
    """Where a live generation (:func:`generate_live`) takes its prompts from; a server implements it.

    ``next_length(timeout)``: the prompt length of the oldest waiting item, waiting up to ``timeout`` seconds
    for one (None: none came); ``take(limit, bucket)``: up to ``limit`` waiting items, oldest first, stopping at
    the first longer than ``bucket`` tokens (so the oldest is never passed over); ``stopping``: True once no more
    will be served."""

    stopping: bool = False

    def next_length(self, timeout: float) -> int | None:
        raise NotImplementedError

    def take(self, limit: int, bucket: int) -> list[LiveItem]:
        raise NotImplementedError


def generate_live(generator, source: LiveSource, *, slots_for, chunk: int, max_length: int,
                  on_pool=None) -> None:
    """Continuous batching over prompts that arrive while it runs, until ``source.stopping``.

    A pool is opened for the length bucket (of prompts up to ``max_length``) of the oldest waiting prompt,
    ``slots_for(columns)`` slots; every slot that frees up takes the next waiting prompt that fits the bucket, so
    a prompt that arrives mid-decode starts at the next host round trip instead of after the running ones. Once
    the oldest waiting prompt does not fit, the pool admits nothing more, finishes its rows and the next pool is
    opened for it. Each row's generation is what :func:`continuous_generate` gives for the same prompt and budget
    (rows never see each other). ``on_pool(timings)``: called after each pool with its :class:`Timings`."""
    buckets = bucket_lengths(max_length)
    max_new = generator.max_new_tokens
    while not source.stopping:
        head = source.next_length(0.1)
        if head is None:
            continue
        bucket = bucket_for(min(head, max_length), buckets)
        slots, why = slots_for(bucket + max_new)
        run = _ContinuousRun(generator, [], [], int(chunk), tqdm(disable=True), None)
        items: dict[int, LiveItem] = {}

        def refill(free: int, run=run, items=items, bucket=bucket) -> list[int]:
            taken = []
            for item in source.take(free, bucket):
                run.prompts.append(item.prompt)
                run.budgets.append(min(int(item.budget), max_new))
                run.results.append(None)
                items[len(run.prompts) - 1] = item
                taken.append(len(run.prompts) - 1)
            return taken

        def delivered(index: int, generation: Generation, run=run, items=items) -> None:
            run.prompts[index] = run.results[index] = None  # a long-lived pool keeps nothing it has delivered
            items.pop(index).deliver(generation)

        def abandoned(index: int, run=run, items=items) -> bool:
            if not items[index].abandoned():
                return False
            run.prompts[index] = None
            del items[index]
            return True

        run.on_result = delivered
        try:
            run.pool(Pool(bucket, [], slots, slots, why), refill, abandoned)
        except Exception as error:  # noqa: BLE001 - the pool's prompts get the error; the next pool starts afresh
            logger.exception("live generation: a pool of %d slots at bucket %d failed", slots, bucket)
            for item in items.values():
                item.deliver(error)
        if on_pool is not None:
            on_pool(Timings(run.clock).add({"max_slots": run.max_slots, "slot_plan": run.slot_plan}))


class _ContinuousRun:
    """One ``continuous_generate`` call: its jitted admit/decode steps, clock, results and progress bar; ``pool``
    runs one slot pool to its end."""

    def __init__(self, generator, prompts, budgets, chunk: int, bar, on_result):
        self.generator, self.prompts, self.budgets, self.chunk = generator, prompts, budgets, chunk
        self.bar, self.on_result = bar, on_result
        self.max_new, self.pad_id = generator.max_new_tokens, generator.pad_id
        self.steps = _jitted(chunk, self.max_new, self.pad_id, target_of(generator.mesh).platform != "cpu")
        self.stop_set = set(np.asarray(generator.stop_ids).tolist())
        self.results: list = [None] * len(prompts)
        self.clock = {"compile_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0, "prefill_tokens": 0, "decode_tokens": 0,
                      "decode_calls": 0, "generated_tokens": 0}
        self.max_slots = 0
        self.slot_plan: dict[str, int] = {}

    def timed(self, kind: str, key, fn, *args):
        """Run ``fn`` to completion; its seconds go to ``kind``, or to compile on the first call of ``key``."""
        begin = time.perf_counter()
        out = fn(*args)
        jax.block_until_ready(out)
        spent = time.perf_counter() - begin
        self.clock["compile_s" if key not in self.steps.shapes_run else kind] += spent
        self.steps.shapes_run.add(key)
        return out

    def pool(self, pool, refill: Callable[[int], list[int]] | None = None,
             abandoned: Callable[[int], bool] | None = None) -> None:
        """Run one slot pool until its rows are done and nothing waits. ``refill(free)`` (a live pool): the
        indices of at most ``free`` prompts that arrived since (appended to ``self.prompts`` / ``budgets``), asked
        whenever a slot is free; a live pool ends once no row runs and ``refill`` gives nothing.
        ``abandoned(index)``: the prompt's result is no longer wanted; its row is freed undelivered."""
        g, bucket, slots, queue = self.generator, pool.bucket, pool.slots, deque(pool.items)
        self.max_slots = max(self.max_slots, slots)
        self.slot_plan[str(bucket)] = slots
        logger.debug("continuous batching: %d prompts of <= %d tokens on %d slots of %d cache columns",
                     len(queue), bucket, slots, bucket + self.max_new)
        # The previous pool's cache and state are dropped before this one's are made: each pool is planned to fill
        # the device on its own (docs/benchmarks.md, "whole-benchmark GRM race at a size where slots fill").
        cache = g.model.init_cache(slots, bucket + self.max_new)
        state = empty_state(slots, self.max_new, int(g.letter_ids.shape[0]), self.pad_id)
        owner: list[int | None] = [None] * slots
        active = [False] * slots  # the rows the device state marks active
        while True:
            free = [row for row in range(slots) if owner[row] is None]
            if refill is not None and len(queue) < len(free):
                queue.extend(refill(len(free) - len(queue)))
            for row in free[:len(queue)]:  # spare slots (power-of-two rounding) stay inactive
                cache, state = self.fill(bucket, slots, queue.popleft(), row, owner, cache, state)
            running = [o is not None for o in owner]
            if not any(running):
                return
            # Finished rows with nothing to admit are marked inactive (their writes are never read).
            if running != active and not all(running):
                state = dataclasses.replace(state, active=jnp.asarray(running))
            active = running
            # A decode call returns early when a row finishes and a prompt waits for its slot (a live pool: may).
            cache, state, _ = self.timed("decode_s", ("decode", bucket, slots), self.steps.decode, g.model, cache,
                                         state, g.stop_ids, g.letter_ids, np.bool_(bool(queue) or refill is not None))
            self.clock["decode_calls"] += 1
            done, count = jax.device_get((state.done, state.count))
            if abandoned is not None:
                for row in range(slots):
                    if owner[row] is not None and not done[row] and abandoned(owner[row]):
                        owner[row] = None
            finished = [row for row in range(slots) if owner[row] is not None and done[row]]
            if not finished:
                continue
            tokens, letters = jax.device_get((state.tokens, state.letters))
            for row in finished:
                self.finish(owner[row], tokens[row, :count[row]], letters[row])
                owner[row] = None

    def fill(self, bucket: int, slots: int, item: int, row: int, owner: list, cache, state):
        """Prefill prompt ``item`` into slot ``row`` (its cache columns and decode state)."""
        g = self.generator
        seq = np.asarray(self.prompts[item], np.int32)
        ids = np.full((1, bucket), self.pad_id, np.int32)
        ids[0, :len(seq)] = seq
        positions = np.where(np.arange(bucket) < len(seq), np.arange(bucket), PAD_POSITION)[None].astype(np.int32)
        cache, state = self.timed("prefill_s", ("admit", bucket, slots), self.steps.admit, g.model, cache, state, ids,
                                  positions, np.array([len(seq) - 1], np.int32), g.letter_ids, np.int32(row),
                                  np.int32(len(seq)), np.int32(self.budgets[item]), g.stop_ids)
        self.clock["prefill_tokens"] += len(seq)
        owner[row] = item
        return cache, state

    def finish(self, item: int, row_tokens: np.ndarray, row_letters: np.ndarray) -> None:
        """Prompt ``item``'s generation from its slot's tokens (cut at the first stop token) and letter log-probs."""
        self.clock["generated_tokens"] += len(row_tokens)
        self.clock["decode_tokens"] += len(row_tokens) - 1  # the first token came from the prefill
        stops = [i for i, t in enumerate(row_tokens.tolist()) if t in self.stop_set]
        end = stops[0] if stops else len(row_tokens)
        self.results[item] = Generation(row_tokens[:end].astype(np.int32), np.asarray(row_letters[:end], np.float32),
                                        bool(stops))
        self.bar.update(1)
        if self.on_result is not None:
            self.on_result(item, self.results[item])


def device_memory_bytes(device=None) -> int | None:
    """``memory_stats()["bytes_limit"]`` of ``device`` (default: the first), None where the backend has none."""
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception as e:  # noqa: BLE001 - backends without allocator stats raise various errors
        if device.platform != "cpu":  # an accelerator always has a limit: losing it shrinks the slot pool
            slow_paths.report("eval_slots_fallback", f"{device.platform} memory_stats() failed ({type(e).__name__}: "
                              f"{e}), so continuous GRM evaluation runs {FALLBACK_SLOTS} slots instead of as many as "
                              "the memory holds", "pass --device-memory-gib (the device's memory) or --batch-size")
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def memory_plan(model, columns: int, memory_bytes: int) -> dict:
    """Byte budget of a slot pool of ``columns`` cache columns per slot on ``memory_bytes`` of memory
    (:func:`longrm_jax.evaluation.grm.slot_plan.plan_slots` with the model's parameter bytes)."""
    return plan_slots(model.config, param_bytes(model), columns, memory_bytes)


def param_bytes(model) -> int:
    """Bytes of every parameter of ``model`` as stored."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def memory_slots(model, columns: int, *, memory_bytes: int | None = None) -> tuple[int, str]:
    """(slots of ``columns`` cache columns that fit next to the weights, why). ``memory_bytes`` overrides the
    device's ``bytes_limit``; with neither, ``FALLBACK_SLOTS``."""
    limit = memory_bytes or device_memory_bytes()
    if not limit:
        return FALLBACK_SLOTS, (f"{FALLBACK_SLOTS}, a fixed default: this device reports no memory size (the CPU "
                                "backend does not); --device-memory-gib sizes the slots from a stated memory, "
                                "--batch-size sets their number")
    plan = memory_plan(model, columns, limit)
    return plan["slots"], describe_plan(plan)


