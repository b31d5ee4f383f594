"""``python -m longrm_jax.train --config C --compile-only --topology NAME``: the run's real train step compiled for
a TPU slice or GPU cluster that this host does not have, and what the compiled programs say about it.

Same code path as training up to the first step: the config's mesh (over the topology's compile-only devices,
``parallel.topology``), the model config, optimizer, train state and batch shapes, the memory plan
(``training.memory_plan.plan_train_step``, remat ``auto`` included) and the two jitted programs of a step. No
data is read and no weight is loaded: the state and the batch are ``ShapeDtypeStruct``s with their shardings.
The memory plan compares each program's compiled memory analysis with the chip's HBM from the topology table.

Printed per chip: the train state, temporaries and peak of each program against the HBM, the remat policy
(``auto``'s choice), the step's FLOPs from XLA's cost analysis beside the count of docs/flops.md (the same
``telemetry.step_flops`` the trainer logs), the step time that count implies at ``--assume-mfu``, and how many
Pallas/Mosaic kernels and collectives the compiled programs hold.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import jax
import numpy as np

from longrm_jax.ops.flash import compiling_for
from longrm_jax.parallel.compiled import cost_flops, describe_counts, flop_text, hlo_op_counts
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.parallel.topology import GiB, Topology, host_count, program_budget, step_seconds
from longrm_jax.training.config_schema import ModelSection, TrainConfig
from longrm_jax.training.data_source import load_tokenizer, slots as data_slots
from longrm_jax.training.memory_budget import HOST_RAM_SHARE
from longrm_jax.training.memory_plan import MemoryPlanError, plan_train_step, predicted_host, predicted_peak
from longrm_jax.training.mesh_plan import plan_auto_mesh
from longrm_jax.training.model_setup import PRESETS, model_config, preset_config, with_training_numerics
from longrm_jax.training.state import lr_schedule, make_optimizer
from longrm_jax.training.step_groups import check_rows_split, groups_bound
from longrm_jax.training.steps import StageSpec
from longrm_jax.training.telemetry import step_flops


@dataclass
class CompileReport:
    """What ``--compile-only`` prints (``lines``) and the figures a table needs."""

    topology: str
    chips: int
    hosts: int
    mesh: dict
    fits: bool
    remat: str = ""
    peak_gib: float = 0.0
    hbm_gib: float = 0.0
    budget_gib: float = 0.0  # what a run's programs may use (parallel.topology.program_budget)
    host_gib: float = 0.0
    flops_counted: float = 0.0
    flops_compiled: float | None = None
    step_s: float = math.inf
    mfu: float = 0.0
    kernels: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)
    error: str = ""


def _model_config(cfg: TrainConfig):
    """(the model's config without its weights, a note): ``model.init``'s when that directory is here, else
    ``model.preset``'s (the shipped 8B configs name their preset for exactly this). A preset without a
    vocabulary of its own takes the tokenizer's (``data.tokenizer`` when it is here, else the bundled one)."""
    tokenizer = None
    if "vocab_size" not in PRESETS.get(cfg.model.preset, {}) and (
            cfg.data.tokenizer is None or os.path.isdir(cfg.data.tokenizer)):
        tokenizer = load_tokenizer(cfg.data)
    init = cfg.model.init
    if init is None or os.path.isdir(init):
        return model_config(cfg, tokenizer), None
    if cfg.model.preset == ModelSection.preset:  # the default: the config did not say which shapes init has
        raise FileNotFoundError(
            f"model.init {init} is not on this host and the config names no model.preset: say which shapes to "
            f"compile for, e.g. --set model.preset=qwen3_8b ({', '.join(sorted(PRESETS))})")
    note = (f"model.init {init} is not on this host: compiling for model.preset {cfg.model.preset}"
            + (" + model.overrides" if cfg.model.overrides else ""))
    return with_training_numerics(preset_config(cfg, tokenizer), cfg), note


def _flops_batch(cfg: TrainConfig, slots: int | None) -> np.ndarray:
    """Segment ids of the step's largest batch: every row full, one segment per ``data.seq_len`` sequence."""
    rows, k = cfg.pipeline_rows_per_step, slots or 1
    return np.repeat(np.arange(1, k + 1, dtype=np.int32), cfg.data.seq_len)[None].repeat(rows, 0)


def _has_host_memory(devices) -> bool:
    try:
        return any(m.kind == "pinned_host" for m in devices[0].addressable_memories())
    except Exception:  # noqa: BLE001 - a description that cannot say: assume it has none
        return False


# How far below a GPU topology's budget a compiled step must be to count as a clear fit: the deviceless compiler
# has no autotuning results and schedules collectives by its own cost model, so a run's own plan can be a few GiB
# higher (72.12 GiB for a step compiled at 69.73: Qwen3-8B SimPO 2 x 256K, mesh.seq=4; docs/compile_only.md,
# "How it works").
GPU_COMPILE_MARGIN_GIB = 3.0


def compile_train_step(cfg: TrainConfig, topology: Topology, *, mfu: float = 0.4) -> CompileReport:
    """Compile ``cfg``'s train step for ``topology`` and report (see the module docstring). Never raises for a
    step that does not fit: ``fits`` is False and ``error`` holds the memory plan's message."""
    devices = topology.devices()
    m, mesh, sizes = cfg.mesh, None, {}
    if not m.auto:  # mesh: auto is chosen with the memory plan below
        mesh = make_mesh(data=m.data, fsdp=m.fsdp, seq=m.seq, tensor=m.tensor, devices=devices)
        check_rows_split(cfg, mesh)
        sizes = {k: int(v) for k, v in mesh.shape.items()}
    report = CompileReport(topology.label, topology.chips, host_count(devices), sizes, fits=False,
                           hbm_gib=topology.chip.hbm_bytes / GiB, mfu=mfu)
    budget, how = program_budget(topology)
    if cfg.memory_budget_gib is not None:
        budget, how = int(cfg.memory_budget_gib * GiB), "memory_budget_gib"
    report.budget_gib = budget / GiB
    mcfg = _describe_setup(report, cfg, topology, how, devices)
    slots = data_slots(cfg)
    num_rejects = 0 if cfg.stage == "sft" else cfg.data.num_rejects
    total_steps = cfg.steps or 1000
    tx, schedule = make_optimizer(cfg.optim, total_steps), lr_schedule(cfg.optim, total_steps)
    spec = StageSpec(cfg.stage, num_rejects, groups_bound(cfg, 1), slots is not None)
    key = jax.random.key(cfg.seed + 1)
    try:
        with compiling_for(devices):
            if m.auto:
                auto = plan_auto_mesh(cfg, mcfg, tx, schedule, spec, devices, key, device_bytes=budget)
                cfg, plan, report.mesh = auto.cfg, auto.plan, {k: int(v) for k, v in auto.mesh.shape.items()}
                report.lines.extend(auto.lines())
            else:
                plan = plan_train_step(cfg, mcfg, tx, schedule, spec, mesh, key, device_bytes=budget)
    except MemoryPlanError as e:
        report.error = str(e)
        report.lines.append(str(e))
        return report
    _describe_plan(report, cfg, plan, topology)
    _describe_programs(report, cfg, mcfg, plan, topology, slots)
    return report


def _describe_setup(report: CompileReport, cfg: TrainConfig, topology: Topology, budget_how: str, devices):
    """The report's first lines (topology, budget, mesh and rows per step); returns the model config compiled."""
    m, out = cfg.mesh, report.lines
    out.append(f"topology {topology.label}: {topology.chips} x {topology.chip.device_kind} "
               f"({report.hosts} host(s)), {report.hbm_gib:.1f} GiB HBM per chip; compile only, nothing runs")
    out.append(f"device budget per chip {report.budget_gib:.1f} GiB: {budget_how}")
    per_step = cfg.data.batch_rows * cfg.grad_accum
    groups = (f", {cfg.pipeline_rows_per_step} preference group(s) of {1 + cfg.data.num_rejects} rows"
              if cfg.data.layout == "rows" and cfg.stage != "sft" else "")
    out.append(("mesh auto" if m.auto else "mesh " + " x ".join(f"{k} {v}" for k, v in report.mesh.items()))
               + f"; stage {cfg.stage}, "
               f"{per_step} rows x {cfg.data.seq_len} tokens per step ({cfg.data.batch_rows} per micro step x "
               f"grad_accum {cfg.grad_accum}{groups})")
    mcfg, note = _model_config(cfg)
    if note:
        out.append(note)
    if cfg.optim.offload_state and not _has_host_memory(devices):
        # JAX's compile-only GPU devices have no host memory space: the plan moves the moments by their size
        out.append("note: these compile-only devices have no host memory space, so optim.offload_state is modelled "
                   "by hand: the AdamW moments count as pinned host memory during the gradient program and as "
                   "device memory during the update (a run brings them in for it); the update's figure is an "
                   "upper bound, 4.5 GiB above a run's plan for Qwen3-8B on one H100 (docs/compile_only.md)")
    return mcfg


def _describe_plan(report: CompileReport, cfg: TrainConfig, plan, topology: Topology) -> None:
    """A plan that fits: its remat choice and per-program memory, the peak against the budget, and the margins."""
    out = report.lines
    report.fits = True
    report.remat = plan.remat
    report.peak_gib = predicted_peak(plan.programs) / GiB
    report.host_gib = predicted_host(plan.programs) / GiB
    tiled = f", model.mlp_chunk_tokens={plan.mlp_chunk_tokens}" if plan.mlp_chunk_tokens else ""
    out.append(f"model.remat={plan.remat}{tiled}{plan.offloaded_setting}"
               + (f" (auto: tried {', '.join(plan.tried)})" if cfg.model.remat == "auto" else ""))
    out.append("per chip:")
    out += [f"  {p.describe()}" for p in plan.programs]
    out.append(f"  peak {report.peak_gib:.2f} GiB of {report.hbm_gib:.1f} GiB HBM "
               f"({100 * report.peak_gib / report.hbm_gib:.0f}%), within the budget of {report.budget_gib:.1f} GiB: "
               "fits")
    if topology.platform == "gpu" and report.budget_gib - report.peak_gib < GPU_COMPILE_MARGIN_GIB:
        out.append(f"  close: within {GPU_COMPILE_MARGIN_GIB:.0f} GiB of the budget. A GPU run's own plan (autotuned "
                   "kernels, the real scheduler) came out 2.4 GiB above a deviceless compile and refused that step "
                   "(docs/compile_only.md); the run's plan decides, before any weights load")
    if report.host_gib and cfg.host_memory_budget_gib is None:
        out.append(f"  pinned host memory {report.host_gib:.1f} GiB per device is not checked: the target host's RAM "
                   "is unknown here; set host_memory_budget_gib to check it (a run's default: "
                   f"{HOST_RAM_SHARE:.0%} of its host's RAM shared by its GPUs)")


def _describe_programs(report: CompileReport, cfg: TrainConfig, mcfg, plan, topology: Topology, slots) -> None:
    """The step's FLOPs (counted and compiled), its time at the report's MFU, and each program's kernels."""
    out = report.lines
    compiled = [(name, c) for name, c in plan.step.programs]
    per_chip = [cost_flops(c) for _, c in compiled]
    counted = step_flops(mcfg, cfg.head, _flops_batch(cfg, slots))
    report.flops_counted = counted
    report.flops_compiled = None if None in per_chip else sum(per_chip) * topology.chips
    report.step_s = step_seconds(counted, topology.chips, topology.chip.peak_bf16, report.mfu)
    compiled_text = ("n/a" if report.flops_compiled is None else
                     f"{flop_text(report.flops_compiled)} (XLA cost analysis, {len(compiled)} programs x "
                     f"{topology.chips} chips: each loop body once, no FLOPs inside kernels; docs/compile_only.md)")
    out.append(f"FLOPs per step: {flop_text(counted)} (docs/flops.md count) | {compiled_text}")
    out.append(f"step time at {100 * report.mfu:.0f}% MFU: {report.step_s:.3g} s "
               f"({topology.chips} x {topology.chip.peak_bf16 / 1e12:.0f} TFLOP/s bf16 peak); "
               f"{cfg.pipeline_rows_per_step * (slots or 1) * cfg.data.seq_len / report.step_s:,.0f} tokens/s")
    for name, c in compiled:
        counts = hlo_op_counts(c.as_text())
        report.kernels[name] = counts
        out.append(f"{name} program: {describe_counts(counts)}")
