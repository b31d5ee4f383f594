"""Corrupt checkpoints on ``--resume``: the newest step whose files read is restored; a newer corrupt step is
named in one warning, moved aside (never deleted) and skipped.

Why: a data file truncated in the newest step stopped ``--resume`` with about 130 lines of TensorStore spec
(exit 1) while an intact older step sat next to it, and a corrupt JSON item (``data/metadata``) or an empty
``state/_METADATA`` was reported as a settings mismatch ("resume with the checkpoint's settings"): the wrong
cause and the wrong advice.

Two checks, newest step first: before any setting is read, every metadata file of a step must hold JSON
(:func:`metadata_problem`, cheap); then the restore itself reads every array, and a failed read
(:func:`read_problem`: TensorStore's OUT_OF_RANGE, DATA_LOSS, ...) moves on to the next older step. A step that
fails either way is renamed to ``corrupt-step-<step>-<time>`` in the same directory (orbax and the step listings
skip names that are not numbers): left in place, the resumed run's own save of that step number would fail
("Checkpoint for step N already exists"). When no step is intact, :class:`CorruptCheckpointError` names the
directory and each step's file (exit 2), and nothing is moved. With ``checkpoint.on_corrupt: error`` the first
corrupt step met stops the resume the same way (exit 2, nothing moved), naming it and the older steps, for a user
who would rather repair or copy that step than resume from an older one and lose the steps in between.

Several processes check the same files and so agree on metadata; a read error that only some processes meet
while restoring their shards is not reconciled (they would stop at orbax's next barrier).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
from jax.experimental import multihost_utils

from longrm_jax.cli_support import InputError
from longrm_jax.training.run_dir import ResumeMismatchError

log = logging.getLogger(__name__)

# The JSON files orbax writes for every step (the step's own record, the three JSON items, the state tree's
# structure), and the OCDBT manifest through which the state's arrays are found.
JSON_FILES = ("_CHECKPOINT_METADATA", "config/metadata", "data/metadata", "model/metadata", "state/_METADATA")
REQUIRED_FILES = ("state/manifest.ocdbt",)
# What a failed read of a stored array says (TensorStore status codes, orbax's wrapper), as opposed to a state
# that does not fit the template (a shape or tree mismatch, reported as ResumeMismatchError).
_READ_ERROR = re.compile(r"OUT_OF_RANGE|DATA_LOSS|Error reading|Error opening|Encountered error while reading|"
                         r"checksum|Unexpected end of|Invalid manifest|corrupt", re.IGNORECASE)


class CorruptCheckpointError(InputError):
    """``--resume`` found no step it can read; the message names the directory and each step's bad file."""


def metadata_problem(directory: str, step: int) -> str | None:
    """What is wrong with ``step``'s metadata files (``"data/metadata is not valid JSON (...)"``), or None."""
    base = os.path.join(directory, str(step))
    for name in JSON_FILES + REQUIRED_FILES:
        path = os.path.join(base, name)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read() if name in JSON_FILES else ""
        except FileNotFoundError:
            return f"{name} is missing"
        except (OSError, UnicodeDecodeError) as e:
            return f"{name} cannot be read ({e})"
        if name not in JSON_FILES:
            continue
        if not text.strip():
            return f"{name} is empty"
        try:
            json.loads(text)
        except ValueError as e:
            return f"{name} is not valid JSON ({e})"
    return None


def read_problem(error: BaseException) -> str | None:
    """One line on the failed read behind a restore error (the array and TensorStore's own words), or None when
    the error is not a read failure."""
    chain, e = [], error
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in reversed(chain):  # the innermost error is the read that failed; outer ones wrap it
        text = str(e)
        if isinstance(e, (json.JSONDecodeError, FileNotFoundError, UnicodeDecodeError)) or _READ_ERROR.search(text):
            first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
            return f"state/ cannot be read: {first[:300]}"
    return None


@dataclass
class ResumePoint:
    """The steps of a checkpoint directory a resume may start from, newest first (their metadata reads), and
    the corrupt ones met so far with what is wrong (newest first)."""

    directory: str
    candidates: list[int]
    bad: list[tuple[int, str]] = field(default_factory=list)
    on_corrupt: str = "fallback"  # checkpoint.on_corrupt: "error" refuses at the first corrupt step

    @property
    def step(self) -> int:
        return self.candidates[0]


def find_resume_point(directory: str, steps: list[int], on_corrupt: str = "fallback") -> ResumePoint:
    """The steps (``steps``: the complete ones) whose metadata reads, newest first; a warning for each corrupt
    newer one. Raises :class:`CorruptCheckpointError` when none does, or when one does not and ``on_corrupt`` is
    "error"."""
    point = ResumePoint(directory, [], on_corrupt=on_corrupt)
    for step in sorted(steps, reverse=True):
        problem = metadata_problem(directory, step)
        if problem is None:
            point.candidates.append(step)
        else:
            point.bad.append((step, problem))
    if not point.candidates:
        raise CorruptCheckpointError(_none_intact(point))
    if on_corrupt == "error" and any(s > point.step for s, _ in point.bad):  # an older bad step loses nothing
        raise CorruptCheckpointError(_refused(point))
    if point.bad:
        _warn(point, point.step, "its settings and state are read from it")
    return point


def restore_newest_intact(point: ResumePoint, open_checkpointer: Callable, state):
    """(checkpointer, state, data_state, step): the newest candidate step restored into ``state`` (an abstract
    or template state), older ones tried when a read fails. Corrupt steps are then set aside and the
    checkpointer opened again, so that orbax's step list no longer holds them."""
    ckpt = open_checkpointer()
    for step in list(point.candidates):
        try:
            restored, data_state, step = ckpt.restore(state, step)
            break
        except Exception as e:  # noqa: BLE001 - sorted here: a failed read, or a state that does not fit
            problem = read_problem(e)
            if problem is None and not isinstance(e, (ValueError, KeyError, TypeError)):
                ckpt.close()
                raise  # neither a failed read nor a mismatch: a bug, with its traceback under --debug
            if problem is None:
                ckpt.close()
                first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
                raise ResumeMismatchError(
                    f"cannot resume from {point.directory} (step {step}): its state does not fit this run's "
                    f"({first[:200]}); resume with the checkpoint's settings or start a new run") from e
            point.candidates.remove(step)
            point.bad.append((step, problem))
            if not point.candidates or point.on_corrupt == "error":
                ckpt.close()
                raise CorruptCheckpointError(_refused(point) if point.candidates else _none_intact(point)) from None
            _warn(point, point.step, "trying it")
    if point.bad:
        ckpt.close()
        _set_aside(point)
        ckpt = open_checkpointer()
    return ckpt, restored, data_state, step


def _warn(point: ResumePoint, step: int, then: str) -> None:
    bad = "; ".join(f"step {s}: {what}" for s, what in point.bad)
    log.warning("--resume: corrupt checkpoint in %s (%s); the newest intact step is %d, %s", point.directory, bad,
                step, then)


def _none_intact(point: ResumePoint) -> str:
    bad = "; ".join(f"step {s}: {os.path.join(point.directory, str(s), what)}" for s, what in point.bad)
    return (f"cannot resume: no intact checkpoint in {point.directory} ({bad}); nothing was changed there. Start a "
            "new run without --resume (checkpoint.overwrite=true moves these steps aside), or point checkpoint.dir "
            "at another copy")


def _refused(point: ResumePoint) -> str:
    """checkpoint.on_corrupt=error: the corrupt steps met (with their bad file) and the older ones left, which
    have not been read in full."""
    bad = "; ".join(f"step {s}: {os.path.join(point.directory, str(s), what)}" for s, what in point.bad)
    older = ", ".join(str(s) for s in point.candidates)
    return (f"cannot resume: corrupt checkpoint in {point.directory} ({bad}); nothing was changed there "
            f"(checkpoint.on_corrupt=error). Older steps there: {older}; repair or replace the bad step, or set "
            f"checkpoint.on_corrupt=fallback to resume from the newest of them that reads (the bad step is kept "
            f"aside)")


def _set_aside(point: ResumePoint) -> None:
    """Rename each corrupt step to ``corrupt-step-<step>-<time>`` (process 0; the others wait for it)."""
    if jax.process_index() == 0:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for step, _ in point.bad:
            src = os.path.join(point.directory, str(step))
            if not os.path.isdir(src):
                continue
            dst = os.path.join(point.directory, f"corrupt-step-{step}-{stamp}")
            os.rename(src, dst)
            log.warning("--resume: corrupt step %d kept aside in %s; the run goes on from step %d", step, dst,
                        point.step)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("longrm_jax corrupt checkpoint steps set aside")
