"""Training metrics: FLOPs / MFU (counted as docs/flops.md describes) and writers (JSON lines, TensorBoard).

FLOPs of a training step (forward + backward, recomputation not counted):
``6 * N_matmul * tokens + 6 * L * H_q * head_dim * sum_over_segments(n^2)``, i.e. per token
``6 N + 6 L H d S`` with S the token's segment length (causal attention: half of ``12 L H d S``).
N_matmul excludes the embedding lookup; the LM head counts when logits are computed (sft, simpo), the score
head for bt.
"""

from __future__ import annotations

import json
import math
import os

import jax
import numpy as np

from longrm_jax.models.config import decoder_matmul_params, output_head_params
from longrm_jax.parallel.topology import CHIPS, chip_of

# Dense bf16 peak per device (docs/flops.md), by a substring of the GPU's device kind; TPU chips by their exact
# kind from parallel.topology.CHIPS; None: MFU is not reported.
PEAK_FLOPS = {"H100": CHIPS["h100"].peak_bf16, "H200": CHIPS["h200"].peak_bf16}


def matmul_params(mcfg, head: str) -> int:
    """``N`` of the FLOP counts: the decoder's matmul weights plus the output head's."""
    return decoder_matmul_params(mcfg) + output_head_params(mcfg, head)


def step_flops(mcfg, head: str, segment_ids: np.ndarray, *, forward_only: bool = False,
               head_tokens: int | None = None) -> float:
    """FLOPs of one train step (or a forward pass) over a host batch's ``segment_ids`` [B, T]; the output
    head counts on ``head_tokens`` tokens (default: every token), e.g. only the response tokens whose LM-head
    log-probs the trainer computes."""
    seg = np.asarray(segment_ids)
    tokens = int((seg > 0).sum())
    sq = 0
    for row in seg.reshape(-1, seg.shape[-1]):
        counts = np.bincount(row[row > 0])
        sq += int((counts.astype(np.int64) ** 2).sum())
    body = decoder_matmul_params(mcfg)
    head_tokens = tokens if head_tokens is None else head_tokens
    total = (6.0 * body * tokens + 6.0 * output_head_params(mcfg, head) * head_tokens
             + 6.0 * mcfg.num_layers * mcfg.num_heads * mcfg.head_dim * sq)
    return total / 3.0 if forward_only else total


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

    def __init__(self, out_dir: str, *, tensorboard: bool = True, append: bool = False):
        self.enabled = jax.process_index() == 0
        self.jsonl = None
        self.tb = None
        if not self.enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        # A resumed run continues the file; a fresh one starts it over.
        self.jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a" if append else "w", encoding="utf-8")
        if tensorboard:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(os.path.join(out_dir, "tensorboard"))

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
