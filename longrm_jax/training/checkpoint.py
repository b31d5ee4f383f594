"""Training checkpoints with orbax: state, data-iterator state, run config and model config per step.

Layout: ``<dir>/<step>/{state,data,config,model}`` written by ``orbax.checkpoint.CheckpointManager``
(keep the last K; asynchronous saves, or synchronous where the training loop says so: ``checkpoint.async_save``,
training.loop ``_async_save``). orbax writes a step into a temporary directory and renames it only when
complete, so a process killed during a save leaves the previous step as the latest restorable one.

``load_trained_weights(dir)`` is the loader for other tools (``python -m longrm_jax.export --checkpoint DIR``
through ``training.model_setup.trained_model``, and ``model.init`` of a later stage): it reads the newest step's
parameters on the host and merges LoRA. ``locate_training_checkpoint`` finds a checkpoint directory and step from
what a user may name (the run's ``output_dir``, its ``checkpoints/``, one step folder).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from longrm_jax.models import ModelConfig
from longrm_jax.training.lora import effective_params

ITEMS = ("state", "data", "config", "model")
DISK_POLICIES = ("error", "delete_oldest")
log = logging.getLogger(__name__)


class CheckpointDiskError(RuntimeError):
    """The disk cannot hold the next checkpoint (raised before anything is written)."""


def _manager(directory: str, *, keep: int = 3, async_save: bool = True, read_only: bool = False,
             save_host_gb: int | None = None):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save, create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only,
    )
    if save_host_gb is None:
        return ocp.CheckpointManager(os.path.abspath(directory), options=options, item_names=ITEMS)
    # Bounded host memory: orbax copies every array to host memory at once by default (an 8B full-parameter
    # state is 49 GB) and lets up to 96 GB be in flight to the disk; this caps both (arrays then move in batches,
    # so part of an asynchronous save blocks). Same on-disk format as StandardSave.
    state = ocp.PyTreeCheckpointHandler(save_concurrent_gb=save_host_gb, save_device_host_concurrent_gb=save_host_gb)
    handlers = {"state": state, **{k: ocp.JsonCheckpointHandler() for k in ITEMS if k != "state"}}
    return ocp.CheckpointManager(os.path.abspath(directory), options=options, item_handlers=handlers)


def model_config_dict(mcfg: ModelConfig) -> dict:
    d = dataclasses.asdict(mcfg)
    d["rope_scaling"] = mcfg.rope_scaling_dict
    return d


class Checkpointer:
    """Saves and restores a run's ``TrainState`` + iterator state + configs."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True, on_low_disk: str = "error",
                 save_host_gb: int | None = None):
        if on_low_disk not in DISK_POLICIES:
            raise ValueError(f"on_low_disk must be one of {DISK_POLICIES}; got {on_low_disk!r}")
        self.directory = os.path.abspath(directory)
        self.on_low_disk = on_low_disk
        self.bounded = save_host_gb is not None
        self.async_save = async_save
        self.manager = _manager(self.directory, keep=keep, async_save=async_save, save_host_gb=save_host_gb)
        # Deletes a previous run that a rerun moved aside (training.run_dir) and returns where it was: the first
        # thing "delete_oldest" frees when the disk cannot hold this run's first checkpoint beside it.
        self.reclaim: Callable[[], str | None] | None = None

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def is_complete(self, step: int) -> bool:
        """Whether ``step`` is on disk and finalized (an asynchronous save still writing it is not)."""
        return step in completed_steps(self.directory)

    def save(self, step: int, state, data_state: dict, config: dict, mcfg: ModelConfig) -> None:
        """Start an (asynchronous) save; device buffers are copied before this returns, so the caller may
        donate ``state`` to the next step right away."""
        self._make_room(step, _state_bytes(state))
        save = ocp.args.PyTreeSave if self.bounded else ocp.args.StandardSave
        try:
            self.manager.save(step, args=ocp.args.Composite(
                state=save(_as_dict(state)),
                data=ocp.args.JsonSave(data_state),
                config=ocp.args.JsonSave(config),
                model=ocp.args.JsonSave(model_config_dict(mcfg)),
            ), force=True)
        except Exception:
            self._remove_unfinished(step)
            raise

    def _remove_unfinished(self, step: int | None = None) -> None:
        """Remove what a save that raised left of ``step`` (None: of any step): orbax leaves its
        ``<step>.orbax-checkpoint-tmp*`` directory behind until the next run starts, beside the kept steps (an
        incomplete step, never a restorable one)."""
        if jax.process_index() != 0:
            return
        prefix = f"{'' if step is None else step}.orbax-checkpoint-tmp"
        for name in os.listdir(self.directory) if os.path.isdir(self.directory) else []:
            if (name.startswith(prefix) if step is not None else prefix in name):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    def _make_room(self, step: int, need: int) -> None:
        """Check, before writing, that the disk holds another checkpoint of ``need`` bytes (orbax keeps the older
        steps until the new one is complete, so a full disk would otherwise fail mid-save, minutes later).
        Policy "delete_oldest" deletes kept steps, oldest first, until it fits (then, until the save completes,
        fewer, possibly no, restorable steps exist); "error" stops with what to change."""
        need = int(need * 1.02) + (64 << 20)  # metadata, per-file overhead
        free = shutil.disk_usage(self.directory).free
        if free >= need:
            return
        self.manager.wait_until_finished()  # a save in flight may still be writing (or deleting) steps
        free = shutil.disk_usage(self.directory).free
        if free < need and self.on_low_disk == "delete_oldest" and self.reclaim is not None:
            place, self.reclaim = self.reclaim(), None
            if place:
                log.warning("checkpoint step %d needs %.1f GB, %.1f GB free under %s: deleted the previous run set "
                            "aside in %s first (checkpoint.on_low_disk=delete_oldest)", step, need / 1e9, free / 1e9,
                            self.directory, place)
                free = shutil.disk_usage(self.directory).free
        steps = sorted(self.manager.all_steps())
        while free < need and self.on_low_disk == "delete_oldest" and steps:
            old = steps.pop(0)
            log.warning("checkpoint step %d needs %.1f GB, %.1f GB free under %s: deleting step %d first "
                        "(checkpoint.on_low_disk=delete_oldest)%s", step, need / 1e9, free / 1e9, self.directory,
                        old, "; no restorable step until this save completes" if not steps else "")
            self.manager.delete(old)
            free = shutil.disk_usage(self.directory).free
        if free < need:
            raise CheckpointDiskError(
                f"checkpoint step {step} needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB are free under "
                f"{self.directory} (kept steps: {sorted(self.manager.all_steps()) or 'none'}). Free disk space, "
                "point checkpoint.dir at a larger disk, lower checkpoint.keep, or set checkpoint.on_low_disk="
                "delete_oldest (the older steps are deleted before the new one is written)."
                + (" A previous run moved aside by checkpoint.overwrite still takes space until this run's first "
                   "checkpoint exists; delete_oldest deletes it first." if self.reclaim is not None else ""))

    def restore(self, state_template, step: int | None = None):
        """(state, data_state, step) of ``step`` (default: latest), placed like ``state_template``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _as_dict(state_template))
        restore = (ocp.args.PyTreeRestore(abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract))
                   if self.bounded else ocp.args.StandardRestore(abstract))
        out = self.manager.restore(step, args=ocp.args.Composite(state=restore, data=ocp.args.JsonRestore()))
        return type(state_template)(**out["state"]), out["data"], step

    def wait(self) -> None:
        try:
            self.manager.wait_until_finished()
        except Exception:  # an asynchronous save failed while writing: its temporary directory goes too
            self._remove_unfinished()
            raise

    def close(self) -> None:
        self.wait()
        self.manager.close()


def _state_bytes(state) -> int:
    """Bytes the state occupies in a checkpoint (global sizes: every process writes its shards of one copy)."""
    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(_as_dict(state)))


def _as_dict(state) -> dict:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}


def is_training_checkpoint(path: str) -> bool:
    """True for a directory written by ``Checkpointer`` (step subdirectories holding ``state``)."""
    if not os.path.isdir(path):
        return False
    return any(os.path.isdir(os.path.join(path, d, "state")) for d in os.listdir(path) if d.isdigit())


def completed_steps(directory: str) -> list[int]:
    """The finalized checkpoint steps in ``directory`` (orbax renames a step's temporary directory to its number
    when the save is complete), ascending."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(d) for d in os.listdir(directory)
                  if d.isdigit() and os.path.isdir(os.path.join(directory, d, "state")))


def trained_model_config(directory: str, step: int | None = None) -> ModelConfig:
    """The ModelConfig recorded in a training checkpoint (no weights read)."""
    manager = _manager(directory, read_only=True)
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{directory}: no complete training checkpoint step")
        meta = manager.restore(step, args=ocp.args.Composite(model=ocp.args.JsonRestore()))
    finally:
        manager.close()
    return ModelConfig(**meta["model"])


def load_trained_weights(directory: str, step: int | None = None) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """(ModelConfig, flat parameter dict as host numpy) of a training checkpoint, LoRA merged.

    Parameters come back in the checkpoint's master dtype; the model config records the trained head.
    """
    manager = _manager(directory, read_only=True)
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{directory}: no complete training checkpoint step")
    meta = manager.restore(step, args=ocp.args.Composite(model=ocp.args.JsonRestore(),
                                                         config=ocp.args.JsonRestore()))
    # FP8 matmuls are a training setting: the tools that read a checkpoint run its weights in their compute dtype.
    mcfg = ModelConfig(**meta["model"]).replace(matmul_dtype="compute")
    run_cfg = meta["config"]
    # Restore on the host as numpy, whatever devices / mesh the training used.
    item = os.path.join(os.path.abspath(directory), str(step), "state")
    ckptr = ocp.PyTreeCheckpointer()
    saved = ckptr.metadata(item).item_metadata.tree
    wanted = {k: saved[k] for k in ("params", "frozen") if k in saved}  # not the optimizer moments
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
    tree = ckptr.restore(item, args=ocp.args.PyTreeRestore(item=wanted, restore_args=as_numpy,
                                                            partial_restore=True))
    params, frozen = dict(tree["params"]), dict(tree.get("frozen") or {})
    if frozen:
        lora_cfg = run_cfg["lora"]
        merged = effective_params(params, frozen, alpha=lora_cfg["alpha"], rank=lora_cfg["rank"])
        params = {k: np.asarray(v) for k, v in merged.items()}
    manager.close()
    return mcfg, params


def locate_training_checkpoint(src: str) -> tuple[str, int | None] | None:
    """(checkpoint directory, step or None for the newest) that ``src`` names: a ``Checkpointer`` directory, a
    run's ``output_dir`` holding one in ``checkpoints/``, or one step folder of it; None for anything else."""
    step = None
    name = os.path.basename(os.path.normpath(src))
    if name.isdigit() and os.path.isdir(os.path.join(src, "state")):  # one step folder: that step
        src, step = os.path.dirname(os.path.normpath(src)), int(name)
    if not is_training_checkpoint(src) and is_training_checkpoint(os.path.join(src, "checkpoints")):
        src = os.path.join(src, "checkpoints")
    return (src, step) if is_training_checkpoint(src) else None


def saved_run_config(directory: str, step: int | None = None) -> tuple[dict, int]:
    """(the run config saved with ``step`` (default: the newest complete one), that step)."""
    manager = _manager(directory, read_only=True)
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{directory}: no complete training checkpoint step (a run killed during its "
                                    "first save?)")
        return manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"], step
    finally:
        manager.close()
