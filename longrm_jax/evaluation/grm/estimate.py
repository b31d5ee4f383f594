"""How long a GRM evaluation will take, said before it starts, and each prompt's share of that time (the
weights of the run's progress bar).

The rule (docs/perf_eval.md, "Run estimate"):

* prefill of a prompt: its bucket's forward FLOPs (``2 N S + 2 L H d S^2``: matmuls and causal attention) at
  the device's prefill MFU (:class:`DeviceRates`) of its dense bf16 peak;
* decode of a pool of ``slots`` rows: its steps are the pool's schedule (:func:`pool_steps`: each prompt, in
  queue order, takes the slot that frees first and holds it for its budget), so a pool that drains (rows
  finished, nothing left to admit) is priced at the steps it really runs, not at full slots. Each step reads
  the weights once and every active row's filled cache (the decode kernel reads only filled columns; mean
  prompt length + half the mean budget; sliding-window layers only their rings, ``slot_plan.kv_cache_bytes``;
  active rows on average = the pool's tokens / its steps), at the
  device's decode efficiency of its memory bandwidth. A prompt's share is its budget's part of its pool's
  decode time. Every judgement is counted at its budget (``--max-new-tokens``, or the simulated lengths), so
  the estimate is an upper bound where judges stop early;
* compiles: the device's seconds per length bucket (its prefill, admission and decode programs, first runs
  included), plus ``UNROLL_COMPILE_S`` when the decode layer loop is unrolled.

Each device's efficiencies are measured on it (Qwen3-8B shapes, bf16, docs/benchmarks.md, docs/perf_eval.md
"Run estimate"), from whole-benchmark runs of `python -m longrm_jax.evaluate` priced by this rule at 100%:
decode 57% of the bandwidth bound on an H200 (35 samples at full context lengths, 4K-64K, 2,048-token budgets: 141.1 s
measured) and 58% on an H100 (112 samples, 0.25 length scale, 512-token budgets: 61.3 s); prefill at 62% of
989 TFLOP/s on an H200 (26,155 tokens/s at 32K; the 35-sample run's prefill took 91% of what 62% prices) and
60% on an H100; first calls 7 s per bucket on an H200 (34.2 s for five) and 6 s on an H100. An estimate says
at most, so an efficiency is the lower of what was measured. A device not in the table (the CPU, TPUs, other
GPUs) gets no estimate, only the plan.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence

from longrm_jax.evaluation.grm.slot_plan import Pool, kv_cache_bytes
from longrm_jax.models.flop_counts import causal_squares, decoder_matmul_params
from longrm_jax.parallel.topology import CHIPS

UNROLL_COMPILE_S = 8.0  # the unrolled decode program's extra compile (docs/perf_eval.md, "The unrolled decode step")


@dataclasses.dataclass(frozen=True)
class DeviceRates:
    """A device kind's memory bandwidth (bytes/s) and dense bf16 peak (FLOP/s), the efficiencies measured on it
    (prefill MFU, decode share of the bandwidth bound, seconds of first calls per length bucket) and where they
    come from."""

    name: str
    bandwidth: float
    peak_flops: float
    prefill_mfu: float
    decode_efficiency: float
    compile_s_per_pool: float
    source: str


# Matched by substring of ``jax.Device.device_kind`` (e.g. "NVIDIA H100 80GB HBM3"); spec sheet figures (SXM),
# the peak from parallel.topology.CHIPS (docs/flops.md), as training.telemetry's MFU takes it.
DEVICES = (
    # Prefill: 32K prompts. Decode and first calls: the 35-sample full-length GRM run (141.1 s of decode for
    # 38,647 tokens, 34.2 s of first calls for five buckets); docs/perf_eval.md, "Run estimate".
    DeviceRates("H200", 4.8e12, CHIPS["h200"].peak_bf16, 0.62, 0.57, 7.0, "efficiencies measured on an H200"),
    # GRM race, H100, 112 samples: 58.4 s prefill, 61.3 s decode, 33.9 s of first calls for six buckets.
    DeviceRates("H100", 3.35e12, CHIPS["h100"].peak_bf16, 0.60, 0.58, 6.0, "efficiencies measured on an H100"),
)


def device_rates(device_kind: str) -> DeviceRates | None:
    return next((d for d in DEVICES if d.name in device_kind), None)


def pool_steps(budgets: Sequence[int], slots: int) -> int:
    """Decode steps of a pool of ``slots`` rows that generates ``budgets`` tokens, prompts admitted in order,
    each to the slot that frees first (continuous batching's schedule; ``slots`` >= 1)."""
    free_at = [0] * max(1, min(slots, len(budgets)))
    for budget in budgets:
        heapq.heapreplace(free_at, free_at[0] + int(budget))
    return max(free_at)


def prefill_flops(config, tokens: int) -> float:
    """Forward FLOPs of one prompt of ``tokens`` tokens: matmuls plus causal attention (scores and values; a
    sliding-window layer counts its window, models.flop_counts.causal_squares)."""
    attention = 2.0 * config.num_heads * config.head_dim * causal_squares(config, tokens)
    return 2.0 * decoder_matmul_params(config) * tokens + attention


@dataclasses.dataclass
class RunEstimate:
    """Seconds of a run by phase, each prompt's share (``prompt_seconds``, by prompt index) and the device's
    rates (None: no rate known, the seconds are priced at H200 rates only to weight the progress bar)."""

    prefill_s: float
    decode_s: float
    compile_s: float
    prompt_seconds: list[float]
    rates: DeviceRates | None
    device_kind: str

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s + self.compile_s

    def message(self) -> str:
        if self.rates is None:
            return (f"no prefill/decode rate known for this device ({self.device_kind}): no time estimate "
                    "(docs/perf_eval.md, 'Run estimate', lists the devices that have one)")
        return (f"estimate: at most about {max(1, math.ceil(self.total_s / 60))} minutes on this device "
                f"({self.device_kind}): prefill {self.prefill_s / 60:.1f} min, decode {self.decode_s / 60:.1f} "
                f"min, compiles {self.compile_s / 60:.1f} min, every judgement at its token budget; "
                f"{self.rates.source}")


def estimate_run(config, weight_bytes: int, pools: Sequence[Pool], lengths: Sequence[int],
                 budgets: Sequence[int], device_kind: str, *, unrolled: bool = False) -> RunEstimate:
    """The estimate of generating ``budgets[i]`` tokens after prompts of ``lengths[i]`` tokens with the slot
    ``pools`` of the run (:func:`longrm_jax.evaluation.grm.slot_plan.plan_pools`)."""
    rates = device_rates(device_kind)
    priced = rates or DEVICES[0]
    prompt_seconds = [0.0] * len(lengths)
    prefill = decode = 0.0
    for pool in pools:
        prefill_one = prefill_flops(config, pool.bucket) / (priced.peak_flops * priced.prefill_mfu)
        tokens = sum(budgets[i] for i in pool.items)
        mean_length = sum(lengths[i] for i in pool.items) / len(pool.items)
        steps = pool_steps([budgets[i] for i in pool.items], pool.slots)
        active = tokens / steps  # rows decoding per step, on average over the pool's schedule
        filled = mean_length + tokens / len(pool.items) / 2  # a row's cache columns, on average
        step = (weight_bytes + active * kv_cache_bytes(config, filled)) / (
            priced.bandwidth * priced.decode_efficiency)
        for i in pool.items:
            prompt_seconds[i] = prefill_one + budgets[i] * steps * step / tokens
            prefill += prefill_one
        decode += steps * step
    compile_s = len(pools) * (priced.compile_s_per_pool + (UNROLL_COMPILE_S if unrolled else 0.0))
    return RunEstimate(prefill, decode, compile_s, prompt_seconds, rates, device_kind)
