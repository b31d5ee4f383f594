"""Training metrics: FLOPs / MFU (counted as docs/flops.md describes) and writers (JSON lines, TensorBoard).

FLOPs of a training step (forward + backward, recomputation not counted):
``6 * N_matmul * tokens + 6 * L * H_q * head_dim * sum_over_segments(n^2)``, i.e. per token
``6 N + 6 L H d S`` with S the token's segment length (causal attention: half of ``12 L H d S``).
N_matmul excludes the embedding lookup; the LM head counts when logits are computed (sft, simpo), the score
head for bt.

LoRA (a frozen base): the step computes the forward (2 N), the activation gradients (2 N) and the adapters'
three matmuls each way, but no weight gradient of a frozen weight: ``4 N`` per token for the frozen weights,
``6`` per adapter parameter (A and B), the attention term unchanged (its backward is activation gradients
only). A head trained fully (``lora.train_modules``) counts 6.
"""

from __future__ import annotations

import json
import math
import os

from dataclasses import dataclass

import jax
import numpy as np

from longrm_jax.models.flop_counts import causal_squares, decoder_matmul_params, output_head_params
from longrm_jax.parallel.topology import CHIPS, chip_of
from longrm_jax.training.lora import is_adapter

# Dense bf16 peak per device (docs/flops.md), by a substring of the GPU's device kind; TPU chips by their exact
# kind from parallel.topology.CHIPS; None: MFU is not reported.
PEAK_FLOPS = {"H100": CHIPS["h100"].peak_bf16, "H200": CHIPS["h200"].peak_bf16}


def matmul_params(mcfg, head: str) -> int:
    """``N`` of the FLOP counts: the decoder's matmul weights plus the output head's."""
    return decoder_matmul_params(mcfg) + output_head_params(mcfg, head)


@dataclass(frozen=True)
class LoraFlops:
    """What a LoRA step trains, for :func:`step_flops`: the number of adapter parameters (A and B of every
    target; each multiplies every token) and whether the output head is trained fully."""

    adapter_params: int
    head_trained: bool

    @classmethod
    def of(cls, trainable: dict) -> "LoraFlops":
        """From a LoRA run's trainable parameters (flat dict of arrays or shapes)."""
        adapters = sum(int(np.prod(v.shape)) for k, v in trainable.items() if is_adapter(k))
        head = any(k.split("/")[0] in ("score", "lm_head") for k in trainable if not is_adapter(k))
        return cls(adapters, head)


def step_flops(mcfg, head: str, segment_ids: np.ndarray, *, forward_only: bool = False,
               head_tokens: int | None = None, lora: LoraFlops | None = None) -> float:
    """FLOPs of one train step (or a forward pass) over a host batch's ``segment_ids`` [B, T]; the output
    head counts on ``head_tokens`` tokens (default: every token), e.g. only the response tokens whose LM-head
    log-probs the trainer computes. ``lora``: a frozen base (docs/flops.md: 4 FLOPs per frozen weight and
    token, 6 per adapter parameter)."""
    seg = np.asarray(segment_ids)
    tokens = int((seg > 0).sum())
    sq = 0.0  # sum over layers and segments of S^2 (causal_squares: a sliding-window layer counts its window)
    for row in seg.reshape(-1, seg.shape[-1]):
        counts = np.bincount(row[row > 0])
        sq += sum(causal_squares(mcfg, int(c)) for c in counts if c)
    body = decoder_matmul_params(mcfg)
    head_tokens = tokens if head_tokens is None else head_tokens
    attention = 6.0 * mcfg.num_heads * mcfg.head_dim * sq
    if forward_only:
        adapters = 0 if lora is None else lora.adapter_params
        return (2.0 * (body + adapters) * tokens + 2.0 * output_head_params(mcfg, head) * head_tokens
                + attention / 3.0)
    if lora is None:
        return 6.0 * body * tokens + 6.0 * output_head_params(mcfg, head) * head_tokens + attention
    head_factor = 6.0 if lora.head_trained else 4.0
    return (4.0 * body * tokens + 6.0 * lora.adapter_params * tokens
            + head_factor * output_head_params(mcfg, head) * head_tokens + attention)


def peak_flops(devices=None) -> float | None:
    devices = devices if devices is not None else jax.devices()
    total = 0.0
    for d in devices:
        kind = getattr(d, "device_kind", "")
        chip = chip_of(kind)
        peak = next((v for k, v in PEAK_FLOPS.items() if k in kind), chip.peak_bf16 if chip else None)
        if peak is None:
            return None
        total += peak
    return total


class MetricsWriter:
    """Appends one JSON object per logged step to ``metrics.jsonl`` and mirrors scalars to TensorBoard.
    Only process 0 writes."""

    def __init__(self, out_dir: str, *, tensorboard: bool = True, append: bool = False,
                 purge_step: int | None = None):
        self.enabled = jax.process_index() == 0
        self.jsonl = None
        self.tb = None
        if not self.enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        # A resumed run continues the file (its replayed steps cut first: training.run_dir.trim_metrics); a fresh
        # one starts it over (an earlier run's file was moved aside).
        self.jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a" if append else "w", encoding="utf-8")
        if tensorboard:
            from tensorboardX import SummaryWriter  # only for tensorboard=true

            # purge_step: TensorBoard drops the events of steps >= it that earlier files of this directory hold
            # (the steps a resume replays), instead of drawing both.
            self.tb = SummaryWriter(os.path.join(out_dir, "tensorboard"), purge_step=purge_step)

    def write(self, step: int, metrics: dict, prefix: str = "train") -> None:
        if not self.enabled:
            return
        clean = {k: (float(v) if v is not None else None) for k, v in metrics.items()}
        self.jsonl.write(json.dumps({"step": step, "split": prefix, **clean}) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in clean.items():
                if v is not None and math.isfinite(v):
                    self.tb.add_scalar(f"{prefix}/{k}", v, step)

    def close(self) -> None:
        """Flush and close (idempotent)."""
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        self.enabled = False


class StepProfiler:
    """Traces optimizer steps ``[start, start + steps)`` (1-based) with ``jax.profiler``: call ``before(step)``
    before running step ``step`` and ``after(step)`` once its results are on the host; ``close()`` stops a trace
    still open (a run that ends or fails inside the window)."""

    def __init__(self, start: int, steps: int, out_dir: str):
        self.start, self.stop, self.out_dir = start, start + steps, out_dir
        self.active = False

    def before(self, step: int) -> None:
        if self.stop > self.start and step == self.start and not self.active:
            os.makedirs(self.out_dir, exist_ok=True)
            jax.profiler.start_trace(self.out_dir)
            self.active = True

    def after(self, step: int) -> None:
        if self.active and step + 1 >= self.stop:
            self.close()

    def close(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False
