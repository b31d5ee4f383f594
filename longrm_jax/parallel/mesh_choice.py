"""``mesh: auto``: the meshes a run could take over its devices and the bytes each moves per step per device.

Three candidates over N devices (``training.mesh_plan`` tries them, fewest bytes first, and takes the first whose
memory plan fits):

- ``data``: data parallel, weights replicated, the optimizer moments sharded over ``data`` (ZeRO-1, set by
  ``mesh.optimizer_axes``; the gradients take the moments' layout, ``training.steps.gradient_shardings``). Moves
  the gradients, reduce-scattered every micro step (``G x (N-1)/N``), and in the update the weights each device's
  moment shard changed, all-gathered back (``G x (N-1)/N``: the trained weights are as large as their
  gradients): ``2 x G x (N-1)/N`` with one micro step, what a ring all-reduce of plain data parallelism moves.
- ``fsdp``: weights, gradients and moments sharded (ZeRO-3). Every micro step gathers every weight in the forward
  and again in the backward (the layers are rematerialised) and reduce-scatters the gradients:
  ``(2 x W + G) x (N-1)/N`` per micro step (W: every weight as stored, frozen LoRA bases included; G: the trained
  weights' gradients). Full fine-tuning: ``3 x W x (N-1)/N``.
- ``seq``: one row's tokens over the devices (ring attention), weights sharded over them as fsdp's (the shipped
  configs' ``param_axes: [fsdp, seq]``). fsdp's bytes plus the ring's: every layer's K and V blocks go round the
  ring, ``2 x layers x tokens x kv_heads x head_dim x bytes x (N-1)/N`` per pass, three passes per micro step (the
  forward; the backward sends K/V again and their gradients dK/dV with them, ``ops.ring``).

Rows: data and fsdp give each device whole rows, so they need ``batch_rows`` to be a multiple of N; seq splits
every row and needs ``seq_len`` to be a multiple of 2N (zigzag halves). Where ``batch_rows`` is not a multiple of
N, data and fsdp may take the step's rows (``batch_rows x grad_accum``) in other micro steps: the fewest rows per
micro step that are a multiple of N and divide the step's rows, ``grad_accum`` the rest (the shipped SimPO
config's 1 x 8 rows over 4 GPUs: 4 x 2). The step trains the same rows with the same loss: both loss reductions
are over the whole step, not per micro step (``training.steps``). Counted per optimizer step (x grad_accum
micro steps) and per device, as XLA builds our step: the collectives inside the micro-step loop run every micro
step. Latency and overlap are not modelled: the figure orders the candidates, it does not predict a step time.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

KINDS = ("data", "fsdp", "seq")
RING_PASSES = 3  # forward K/V; backward K/V and dK/dV (ops.ring)


@dataclass(frozen=True)
class StepTraffic:
    """What a step's collectives depend on: ``weight_bytes`` every weight as stored (trainable and frozen),
    ``grad_bytes`` the trained weights' gradients (= their bytes), ``micro_steps`` grad_accum, ``tokens`` per micro
    step (all rows), ``kv_bytes_per_token`` one token's K and V over every layer (2 x layers x kv_heads x head_dim
    x compute bytes)."""

    weight_bytes: int
    grad_bytes: int
    micro_steps: int = 1
    tokens: int = 0
    kv_bytes_per_token: int = 0


def bytes_moved(kind: str, n: int, t: StepTraffic) -> int:
    """Bytes one device sends (= receives) per optimizer step with the ``kind`` mesh over ``n`` devices."""
    if kind not in KINDS:
        raise ValueError(f"unknown mesh kind {kind!r}; one of {', '.join(KINDS)}")
    if n <= 1:
        return 0
    share = (n - 1) / n
    if kind == "data":
        return round((t.micro_steps + 1) * t.grad_bytes * share)
    sharded = t.micro_steps * (2 * t.weight_bytes + t.grad_bytes) * share
    if kind == "fsdp":
        return round(sharded)
    return round(sharded + t.micro_steps * RING_PASSES * t.tokens * t.kv_bytes_per_token * share)


@dataclass
class Candidate:
    """One mesh ``mesh: auto`` considers: its axis sizes and weight / moment axes, its bytes per step, and the
    outcome (``refused``: why not; ``chosen``)."""

    kind: str
    sizes: dict
    param_axes: list
    optimizer_axes: list | None
    bytes_per_step: int
    refused: str = ""
    chosen: bool = False
    notes: list = field(default_factory=list)
    resplit: tuple[int, int] | None = None  # (data.batch_rows, grad_accum) the step's rows are taken in instead

    @property
    def label(self) -> str:
        zero = " (ZeRO-1)" if self.optimizer_axes else ""
        return f"{self.kind}={self.sizes[self.kind]}{zero}"


def resplit_rows(n: int, batch_rows: int, grad_accum: int, group_rows: int = 1) -> tuple[int, int] | None:
    """(rows per micro step, micro steps) taking the step's ``batch_rows x grad_accum`` rows with whole rows on
    each of ``n`` devices: the fewest rows per micro step that are a multiple of ``n`` (and of ``group_rows``, the
    rows of one preference group in the rows layout) and divide the step's rows; None where none does."""
    step_rows, unit = batch_rows * grad_accum, math.lcm(n, group_rows)
    for rows in range(unit, step_rows + 1, unit):
        if step_rows % rows == 0:
            return rows, step_rows // rows
    return None


def _whole_rows(cand: Candidate, n: int, batch_rows: int, seq_len: int, grad_accum: int, group_rows: int,
                traffic: StepTraffic) -> None:
    """A data or fsdp candidate whose ``batch_rows`` do not split over ``n``: re-split the step's rows, or refuse."""
    split = resplit_rows(n, batch_rows, grad_accum, group_rows)
    if split is None:
        cand.refused = (f"data.batch_rows {batch_rows} does not split into a row per device over {n}, nor do the "
                        f"step's {batch_rows * grad_accum} rows (batch_rows x grad_accum)")
        return
    rows, accum = split
    cand.resplit = split
    cand.bytes_per_step = bytes_moved(cand.kind, n, dataclasses.replace(traffic, micro_steps=accum,
                                                                        tokens=seq_len * rows))
    cand.notes.append(f"the step's {batch_rows * grad_accum} rows as data.batch_rows={rows} x grad_accum={accum} "
                      f"(configured {batch_rows} x {grad_accum}; the same rows and loss)")


def candidates(n: int, batch_rows: int, seq_len: int, traffic: StepTraffic,
               bucket_multiple: int | None = None, grad_accum: int = 1, group_rows: int = 1) -> list[Candidate]:
    """The candidates over ``n`` devices, fewest bytes first (ties: the order of ``KINDS``), those the rows
    cannot take already refused; ``bucket_multiple``: what shorter buckets' lengths are multiples of (data with
    several buckets), which the ring needs to divide too; ``grad_accum`` and ``group_rows`` (a preference group's
    rows in the rows layout): what data and fsdp may re-split the step's rows by (``resplit_rows``). One device:
    the one mesh, nothing to choose."""
    if n == 1:
        return [Candidate("fsdp", {"data": 1, "fsdp": 1, "seq": 1, "tensor": 1}, ["fsdp"], None, 0,
                          notes=["one device: nothing to choose"])]
    out = []
    for kind in KINDS:
        sizes = {"data": 1, "fsdp": 1, "seq": 1, "tensor": 1} | {kind: n}
        axes = {"data": ["fsdp"], "fsdp": ["fsdp"], "seq": ["fsdp", "seq"]}[kind]
        cand = Candidate(kind, sizes, axes, ["data"] if kind == "data" else None, bytes_moved(kind, n, traffic))
        if kind != "seq" and batch_rows % n:
            _whole_rows(cand, n, batch_rows, seq_len, grad_accum, group_rows, traffic)
        elif kind == "seq" and seq_len % (2 * n):
            cand.refused = f"data.seq_len {seq_len} is not a multiple of 2 x {n} (zigzag ring halves)"
        elif kind == "seq" and bucket_multiple and bucket_multiple % (2 * n):
            cand.refused = f"data.bucket_multiple {bucket_multiple} is not a multiple of 2 x {n} (zigzag ring halves)"
        out.append(cand)
    return sorted(out, key=lambda c: (c.bytes_per_step, KINDS.index(c.kind)))


def human(x: float) -> str:
    """Bytes in the largest binary unit below them (a tiny test model's KiB and an 8B model's GiB both read)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def table(cands: list[Candidate], n: int, budget_text: str = "") -> list[str]:
    """The choice as lines: the chosen mesh, then each candidate's bytes per step and why it was taken or not."""
    chosen = next((c for c in cands if c.chosen), None)
    head = (f"mesh auto over {n} device(s): chose {chosen.label}" if chosen else
            f"mesh auto over {n} device(s): no candidate fits") + (f" ({budget_text})" if budget_text else "")
    lines = [head, f"  {'candidate':<17} {'moved/step/device':>18}  outcome"]
    for c in cands:
        lines.append(f"  {c.label:<17} {human(c.bytes_per_step):>18}  {_outcome(c)}")
    return lines


def _outcome(c: Candidate) -> str:
    """Why ``c`` was taken, refused, passed over (it fits, but tight) or not tried."""
    if c.chosen:
        return "chosen: " + "; ".join(c.notes)
    if c.notes and c.notes[0].startswith("fits"):
        return "not taken: " + "; ".join(c.notes)
    split = f" (as data.batch_rows={c.resplit[0]} x grad_accum={c.resplit[1]})" if c.resplit else ""
    if c.refused:
        return f"refused: {c.refused}{split}"
    return "not tried: a candidate moving fewer bytes fits" + split


def as_json(cands: list[Candidate]) -> list[dict]:
    return [{"kind": c.kind, "mesh": c.sizes, "param_axes": c.param_axes, "optimizer_axes": c.optimizer_axes,
             "bytes_per_step": c.bytes_per_step, "chosen": c.chosen, "refused": c.refused, "notes": c.notes,
             "batch_rows_x_grad_accum": list(c.resplit) if c.resplit else None}
            for c in cands]
