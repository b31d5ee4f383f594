"""A run's ``output_dir`` across reruns and resumes: nothing of a previous run is lost before it is replaced.

* A fresh run (no ``--resume``, or ``--resume`` without a checkpoint) finds its directory as an earlier run left
  it. Checkpoints there are replaced only with ``checkpoint.overwrite: true``; this is checked before anything
  else (``check_fresh_run_allowed``). Once the new run has compiled its step, loaded its model and is about to
  train, the earlier run's checkpoints and records (metrics.jsonl, tensorboard/, config.yaml, memory_plan.json)
  are *moved* into ``<output_dir>/previous_run-<time>/`` (``set_aside_previous_run``), and deleted only once the
  new run's first scheduled checkpoint is complete (an interrupt's save does not count; a ``--resume`` of the
  interrupted rerun takes the deletion over), or the run finished, for runs that save none, and only under
  ``checkpoint.overwrite: true`` (without it, records of a run that left no checkpoint stay where they were moved). A run that fails before its first checkpoint leaves the old
  run intact in that directory (logged). A checkpoint directory outside ``output_dir`` that cannot be renamed
  into it (another file system) goes to ``<checkpoint.dir>.previous-<time>`` instead.
* A resumed run first compares the settings saved with the checkpoint with its own
  (``check_resume_compatible``): settings that change the train state or the data stream stop it with one line
  naming each difference, before anything is written; other differences (learning rate, step count, ...) are
  logged. Its config.yaml is written only after the restore succeeded (training.loop), and the metrics of the
  steps it replays are cut from metrics.jsonl (``trim_metrics``) and purged from TensorBoard (``purge_step``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass

import jax
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from longrm_jax.cli_support import InputError

RECORD_FILES = ("metrics.jsonl", "tensorboard", "config.yaml", "memory_plan.json", "judge")
PREVIOUS_PREFIX = "previous_run-"

# Settings (dotted prefixes) a checkpoint cannot be resumed under when they changed: they change the train
# state's tree (stage -> head, model, LoRA) or the data stream the saved iterator position points into.
RESUME_FIXED = ("stage", "seed", "model.init", "model.preset", "model.overrides", "model.head", "model.param_dtype",
                "lora", "data")
# Data settings that change neither the training stream nor the state.
RESUME_FREE_DATA = ("data.worker_count", "data.eval_source", "data.num_eval")


def say(msg: str) -> None:
    """A console line of the run (process 0), printed above a progress bar if one is shown."""
    if jax.process_index() == 0:
        tqdm.write(msg)


class ResumeMismatchError(InputError):
    """``--resume`` with settings the checkpoint cannot continue under (or a state it cannot be restored into)."""


def check_fresh_run_allowed(ckpt_dir: str, overwrite: bool, has_checkpoint: bool) -> None:
    """Stop a fresh run into a checkpoint directory of an earlier run unless ``checkpoint.overwrite``."""
    if has_checkpoint and not overwrite:
        raise FileExistsError(f"{ckpt_dir} already holds checkpoints of an earlier run: pass --resume to "
                              "continue it, --set checkpoint.overwrite=true to replace it, or another output_dir")


@dataclass
class SetAside:
    """Where a fresh run moved the previous run's files, and whether it deletes them once it has a checkpoint."""

    places: list[str]  # directories holding what was moved (the previous_run-* one, a checkpoints.previous-*)
    delete_when_replaced: bool
    released: bool = False

    def release_now(self) -> str | None:
        """Delete the set-aside files at once if this run may (checkpoint.overwrite); returns where they were."""
        if self.released or not self.delete_when_replaced:
            return None
        for place in self.places:
            shutil.rmtree(place, ignore_errors=True)
        self.released = True
        return ", ".join(self.places)

    def release_if_replaced(self, replaced: bool, why: str = "this run's first checkpoint is complete") -> None:
        """Delete the set-aside files once the new run has replaced them (process 0)."""
        if replaced and (place := self.release_now()):
            say(f"previous run deleted ({place}): {why}")

    def say_kept(self) -> None:
        """Log where the set-aside files still are (an interrupted run, before a checkpoint of its schedule)."""
        if not self.released:
            say(f"previous run kept in {', '.join(self.places)}: this run has no scheduled checkpoint yet "
                "(an interrupt's save does not replace it); --resume continues and replaces it at the next one")


def earlier_set_aside_runs(output_dir: str, ckpt_dir: str) -> list[str]:
    """Folders where earlier reruns set runs aside: ``<output_dir>/previous_run-*`` and
    ``<checkpoint.dir>.previous-*``, oldest first."""
    found = []
    if os.path.isdir(output_dir):
        found += [os.path.join(output_dir, n) for n in os.listdir(output_dir) if n.startswith(PREVIOUS_PREFIX)]
    parent, base = os.path.split(os.path.normpath(ckpt_dir))
    if os.path.isdir(parent or "."):
        found += [os.path.join(parent, n) for n in os.listdir(parent or ".") if n.startswith(base + ".previous-")]
    return sorted(p for p in found if os.path.isdir(p))


def adopt_set_aside_runs(output_dir: str, ckpt_dir: str, overwrite: bool) -> SetAside | None:
    """On ``--resume``: runs that an interrupted rerun set aside, to be deleted when the resumed run replaces
    them as that rerun would have (its next scheduled checkpoint; ``checkpoint.overwrite``). Process 0 only."""
    places = earlier_set_aside_runs(output_dir, ckpt_dir) if jax.process_index() == 0 and overwrite else []
    if not places:
        return None
    say(f"previous run(s) set aside in {', '.join(places)}: deleted once this run's next scheduled checkpoint is "
        "complete (checkpoint.overwrite)")
    return SetAside(places=places, delete_when_replaced=True)


def set_aside_previous_run(output_dir: str, ckpt_dir: str, has_checkpoint: bool, overwrite: bool) -> SetAside | None:
    """Move an earlier run's checkpoints and records out of the way of a fresh run (process 0; every process
    waits for it). Returns None when there was nothing to move."""
    aside = None
    if jax.process_index() == 0:
        aside = _move_aside(output_dir, ckpt_dir, has_checkpoint, overwrite)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("longrm_previous_run_set_aside")
    return aside


def _move_aside(output_dir: str, ckpt_dir: str, has_checkpoint: bool, overwrite: bool) -> SetAside | None:
    # Runs that earlier reruns set aside and did not replace (stopped before a scheduled checkpoint) go with this
    # one: whatever this run replaces, it replaces all of them at once, so they never pile up.
    earlier = earlier_set_aside_runs(output_dir, ckpt_dir)
    records = [name for name in RECORD_FILES if os.path.exists(os.path.join(output_dir, name))]
    ckpt_present = has_checkpoint or (os.path.isdir(ckpt_dir) and bool(os.listdir(ckpt_dir)))
    if not records and not ckpt_present:
        return SetAside(places=earlier, delete_when_replaced=overwrite) if earlier else None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = os.path.join(output_dir, PREVIOUS_PREFIX + stamp)
    suffix = 1
    while os.path.exists(target):
        target = os.path.join(output_dir, f"{PREVIOUS_PREFIX}{stamp}-{suffix}")
        suffix += 1
    os.makedirs(target)
    places = [target]
    for name in records:
        os.rename(os.path.join(output_dir, name), os.path.join(target, name))
    if ckpt_present and os.path.realpath(ckpt_dir) == os.path.realpath(output_dir):
        os.makedirs(os.path.join(target, "checkpoints"))  # checkpoint.dir is output_dir: move its step folders
        for name in os.listdir(ckpt_dir):
            if name.split(".")[0].isdigit():
                os.rename(os.path.join(ckpt_dir, name), os.path.join(target, "checkpoints", name))
    elif ckpt_present:
        try:
            os.rename(ckpt_dir, os.path.join(target, "checkpoints"))
        except OSError:  # another file system: rename beside it instead of copying (an 8B state is ~50 GB)
            beside = f"{os.path.normpath(ckpt_dir)}.previous-{stamp}"
            os.rename(ckpt_dir, beside)
            places.append(beside)
    delete = overwrite
    what = ("checkpoints and records" if ckpt_present and records else "checkpoints" if ckpt_present
            else "records (" + ", ".join(records) + ")")
    say(f"previous run's {what} moved to {' and '.join(places)}; "
        + ("deleted once this run's first scheduled checkpoint is complete, or the run has finished "
           "(checkpoint.overwrite)" if delete else "kept there (checkpoint.overwrite is false)")
        + (f"; with the runs set aside before it: {', '.join(earlier)}" if earlier else ""))
    return SetAside(places=earlier + places, delete_when_replaced=delete)


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in ("overrides", "synthetic"):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


# Settings whose default became null ("decide from the run") after runs had been saved with true: resuming such
# a run under the new default is no change of setting.
BECAME_AUTOMATIC = ("checkpoint.async_save", "progress")


def _fixed(key: str) -> bool:
    if key.startswith(RESUME_FREE_DATA):
        return False
    return any(key == p or key.startswith(p + ".") for p in RESUME_FIXED)


def check_resume_compatible(saved: dict, current: dict, ckpt_dir: str, step: int) -> list[str]:
    """Raise ``ResumeMismatchError`` naming every setting that differs from the checkpoint's and cannot change
    on a resume; return (and log) the other differences as ``"key: old -> new"``."""
    old, new = _flatten(saved), _flatten(current)
    # Keys only one side has are settings added or removed by a code change, not by the user: not compared.
    # A setting that became automatic (null) where an older run saved the value it then defaulted to is not a
    # change the user made.
    diffs = [(k, old[k], new[k]) for k in sorted(set(old) & set(new))
             if old[k] != new[k] and not (new[k] is None and k in BECAME_AUTOMATIC)]
    fixed = [f"{k} {a!r} -> {b!r}" for k, a, b in diffs if _fixed(k)]
    if fixed:
        raise ResumeMismatchError(
            f"cannot resume from {ckpt_dir} (step {step}): it was trained with other settings: {'; '.join(fixed)}. "
            "Resume with the checkpoint's settings, or start a new run (another output_dir, or "
            "checkpoint.overwrite=true without --resume)")
    changed = [f"{k}: {a!r} -> {b!r}" for k, a, b in diffs]
    if changed:
        say(f"resuming step {step} with settings changed since the checkpoint: {'; '.join(changed)}")
    return changed


def trim_metrics(output_dir: str, last_step: int) -> int:
    """Cut the rows of ``metrics.jsonl`` logged after ``last_step`` (steps a resume replays); returns how many.
    Written aside and renamed, so a crash here leaves the old file whole."""
    path = os.path.join(output_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        try:
            step = json.loads(line).get("step", 0)
        except (json.JSONDecodeError, AttributeError):  # a line cut by a kill mid-write
            continue
        if step <= last_step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) == len(lines):
        return 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(path + ".tmp", path)
    say(f"metrics.jsonl: {len(lines) - len(kept)} rows after step {last_step} dropped (this resume replays them)")
    return len(lines) - len(kept)
