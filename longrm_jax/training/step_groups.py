"""The train step's batch shape contract: how a micro step's rows split over the mesh, and how many preference
groups per row a step is compiled for (a static shape of its reductions), with one compiled step per bound met.

Shared by the run (training.loop) and ``--compile-only`` (training.compile_only), which must compile the same
step."""

from __future__ import annotations

import jax
from jax.experimental import multihost_utils
import numpy as np

from longrm_jax.cli_support import InputError
from longrm_jax.training import batches as batch_lib
from longrm_jax.training.config_schema import TrainConfig
from longrm_jax.training.steps import StageSpec, jit_train_step, make_train_step


def check_rows_split(cfg: TrainConfig, mesh) -> None:
    """A micro step's ``data.batch_rows`` rows are split over the mesh's data x fsdp devices: refuse a count that
    does not divide (a run failed placing its first batch with a raw IndivisibleError; a compile for a topology
    padded the rows and reported a step that would not run)."""
    split = int(mesh.shape["data"]) * int(mesh.shape["fsdp"])
    if cfg.data.batch_rows % split:
        raise InputError(f"data.batch_rows ({cfg.data.batch_rows}) must be a multiple of mesh data x fsdp "
                         f"({mesh.shape['data']} x {mesh.shape['fsdp']} = {split}): each micro step's rows are split "
                         f"over those devices (e.g. data.batch_rows={split * max(1, -(-cfg.data.batch_rows // split))},"
                         " with grad_accum for the rows per optimizer step)")


def groups_bound(cfg: TrainConfig, observed: int) -> int:
    """Static number of groups per row the step is compiled for: ``data.max_groups_per_row`` or, when a row
    holds more, the next power of two (one more compilation); 1 for ``data.layout: rows``."""
    if cfg.data.layout == "rows":
        return 1
    bound = max(cfg.data.max_groups_per_row, 1)
    while bound < observed:
        bound *= 2
    return bound


def global_max_groups(host: dict) -> int:
    """Largest groups-per-row over every process's rows (all processes must compile the same step)."""
    local = int(np.max(host["num_groups"])) if host["num_groups"].size else 0
    if jax.process_count() == 1:
        return local
    return int(np.max(multihost_utils.process_allgather(np.int32(local))))


class StepsByGroups:
    """The jitted train step compiled for a number of groups per row: the planned one first, one more
    compilation per larger bound met."""

    def __init__(self, cfg: TrainConfig, codec, tx, schedule, state_sh, mesh, num_rejects: int, slotted: bool,
                 first_spec: StageSpec, first_step):
        self.cfg, self.codec, self.tx, self.schedule, self.state_sh = cfg, codec, tx, schedule, state_sh
        self.num_rejects, self.slotted = num_rejects, slotted
        self.batch_sh = batch_lib.batch_shardings(mesh, slotted=slotted)
        self.compiled: dict[int, object] = {first_spec.max_groups: first_step}

    def __call__(self, groups: int):
        bound = groups_bound(self.cfg, groups)
        if bound not in self.compiled:
            spec = StageSpec(self.cfg.stage, self.num_rejects, bound, self.slotted)
            self.compiled[bound] = jit_train_step(make_train_step(self.cfg, self.codec, self.tx, spec, self.schedule),
                                                  self.state_sh, self.batch_sh)
        return self.compiled[bound]
