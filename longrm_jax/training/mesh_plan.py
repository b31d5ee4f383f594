"""``mesh: auto``: the mesh chosen by what fits and what moves least.

The candidates and their bytes per step come from ``parallel.mesh_choice`` (data parallel with ZeRO-1, FSDP, the
``seq`` ring); this module sizes them for a run's model and data and asks the memory plan
(``training.memory_plan.plan_train_step``) about each, fewest bytes first, until one fits. The plan's own lower
bound (weights + gradients + optimizer state per device + batch + the layer inputs an on-device remat policy
keeps) refuses a hopeless candidate before anything compiles, so a replicated 8B state on 80 GB GPUs costs no
compile. The chosen candidate's compiled step is the run's (no second compile).

A candidate that fits with less than ``TIGHT_SHARE`` of the budget to spare is taken only when no other
candidate fits with more: bytes per step order candidates whose step times barely differ, while a step at the edge
of the memory can fail at run time (docs/perf_training.md, "The shipped SimPO config on four GPUs").

The result: the config with the mesh section resolved (explicit sizes, ``param_axes``, ``optimizer_axes``), the
mesh, the step's plan, and the candidates with their outcomes (printed as a table by the trainer and by
``--compile-only``, written to memory_plan.json under ``"mesh_auto"``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import numpy as np

from longrm_jax.cli_support import InputError
from longrm_jax.parallel import mesh_choice
from longrm_jax.parallel.mesh import MESH_AXES, make_mesh
from longrm_jax.training.config_schema import TrainConfig
from longrm_jax.training.memory_plan import MemoryPlanError, StepPlan, plan_train_step, predicted_peak
from longrm_jax.training.mesh_config import MeshSection
from longrm_jax.training.model_setup import codec_for
from longrm_jax.training.state import abstract_state


# A fitting candidate this close to the budget is "tight": fewer bytes per step do not outweigh the risk that the
# run cannot place a large temporary block (Qwen3-8B, fp32 weights, a 128,000-token row per GPU: ZeRO-1 predicted
# at 127.4 of 128.8 GiB runs out of memory allocating its 74 GiB of temporaries, FSDP at 106 GiB runs;
# docs/perf_training.md, "The shipped SimPO config on four GPUs").
TIGHT_SHARE = 0.08


@dataclass
class AutoMesh:
    cfg: TrainConfig  # mesh section resolved
    mesh: object
    plan: StepPlan
    candidates: list

    def lines(self) -> list[str]:
        return mesh_choice.table(self.candidates, self.mesh.size)


def resolved(cfg: TrainConfig, cand: mesh_choice.Candidate) -> TrainConfig:
    """``cfg`` with the mesh of ``cand`` in place of ``auto``, and the step's rows re-split where ``cand`` takes
    them in other micro steps (``Candidate.resplit``)."""
    section = MeshSection(auto=False, param_axes=list(cand.param_axes), optimizer_axes=cand.optimizer_axes,
                          **cand.sizes)
    cfg = dataclasses.replace(cfg, mesh=section)
    if cand.resplit:
        rows, accum = cand.resplit
        cfg = dataclasses.replace(cfg, grad_accum=accum, data=dataclasses.replace(cfg.data, batch_rows=rows))
    return cfg


def step_traffic(cfg: TrainConfig, mcfg, tx, key) -> mesh_choice.StepTraffic:
    """What the candidates' collectives depend on, from the abstract train state (shapes only, nothing placed)."""
    one = make_mesh(data=1, fsdp=1, seq=1, tensor=1, devices=jax.devices()[:1])
    state, _ = abstract_state(dataclasses.replace(cfg, mesh=MeshSection(fsdp=1)), codec_for(mcfg), tx, one, key)

    def size(tree):
        return sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))

    trained = size(state.params)
    kv = 2 * mcfg.num_layers * mcfg.num_kv_heads * mcfg.head_dim * np.dtype(mcfg.compute_dtype).itemsize
    return mesh_choice.StepTraffic(weight_bytes=trained + size(state.frozen), grad_bytes=trained,
                                   micro_steps=cfg.grad_accum, tokens=cfg.data.batch_rows * cfg.data.seq_len,
                                   kv_bytes_per_token=kv)


def _why_not(err: MemoryPlanError) -> str:
    """The memory plan's refusal as one short reason."""
    first = str(err).splitlines()[0].removeprefix("the train step does not fit ").rstrip(":")
    if not err.tried:
        return "before compiling: " + first
    return "compiled: " + first if len(err.tried) == 1 else f"compiled, tried {', '.join(err.tried)}: {first}"


def plan_auto_mesh(cfg: TrainConfig, mcfg, tx, schedule, spec, devices, key, *,
                   device_bytes: int | None = None) -> AutoMesh:
    """Choose the mesh for ``cfg`` (``mesh.auto``) over ``devices``: the candidate moving the fewest bytes per
    step whose memory plan fits. Raises ``MemoryPlanError`` with the table when none does."""
    d = cfg.data
    cands = mesh_choice.candidates(len(devices), d.batch_rows, d.seq_len, step_traffic(cfg, mcfg, tx, key),
                                   d.bucket_multiple if d.num_buckets > 1 else None, cfg.grad_accum, cfg.group_rows)
    last, tight = None, None
    for cand in cands:
        if cand.refused:
            continue
        run_cfg = resolved(cfg, cand)
        mesh = make_mesh(**cand.sizes, devices=devices)
        try:
            plan = plan_train_step(run_cfg, mcfg, tx, schedule, spec, mesh, key, device_bytes=device_bytes)
        except MemoryPlanError as err:
            cand.refused, last = _why_not(err), err
            continue
        peak = predicted_peak(plan.programs)
        cand.notes.insert(0, f"fits, predicted peak {mesh_choice.human(peak)} per device (model.remat={plan.remat})")
        if len(cands) > 1 and plan.budget is not None and peak > (1 - TIGHT_SHARE) * plan.budget:
            cand.notes.append(f"tight: within {TIGHT_SHARE:.0%} of the budget of {mesh_choice.human(plan.budget)}")
            tight = tight or (cand, run_cfg, mesh, plan)
            continue
        return _take(cand, run_cfg, mesh, plan, cands, devices, "the fewest bytes of those that fit"
                     + (" with room to spare" if tight else ""))
    if tight:
        return _take(*tight, cands, devices, "the only candidate that fits" if sum(
            not c.refused for c in cands) == 1 else "the fewest bytes of those that fit, all tight")
    table = "\n".join(mesh_choice.table(cands, len(devices)))
    raise MemoryPlanError(f"mesh auto: no mesh over {len(devices)} device(s) fits\n{table}"
                          + (f"\nthe last one tried: {last}" if last is not None else ""),
                          last.tried if last is not None else [], last.last if last is not None else None)


def _take(cand, run_cfg, mesh, plan, cands, devices, why: str) -> AutoMesh:
    """The chosen candidate as the run's mesh, the choice recorded in its plan."""
    cand.chosen = True
    if len(cands) > 1:
        cand.notes.append(why)
    same_choice_everywhere(cand.sizes)
    plan.mesh_auto = {"chosen": cand.sizes, "candidates": mesh_choice.as_json(cands),
                      "table": mesh_choice.table(cands, len(devices))}
    return AutoMesh(run_cfg, mesh, plan, cands)


def same_choice_everywhere(sizes: dict) -> None:
    """Each process of a multi-process run plans its mesh on its own; they must agree, or the first collective
    would wait forever. Every process gathers every choice and all raise together if one differs (another GPU
    model or memory fraction on one host, say)."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils  # noqa: PLC0415 - multi-process runs only

    mine = np.array([sizes.get(axis, 1) for axis in MESH_AXES], np.int32)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, len(MESH_AXES))
    if not (every == mine).all():
        choices = sorted({", ".join(f"{a}={int(n)}" for a, n in zip(MESH_AXES, row) if n != 1) or "one device"
                          for row in every.tolist()})
        raise InputError(f"mesh auto: the {len(every)} processes chose different meshes ({'; '.join(choices)}): "
                         "check that every host has the same GPUs and XLA_PYTHON_CLIENT_MEM_FRACTION, or set the "
                         "mesh by hand (--set mesh.fsdp=N ...)")
