"""Build and compile a run's train step for abstract inputs (no weights loaded): the step of one remat candidate,
which ``training.memory_plan`` measures and chooses among, and which the run then keeps.

``abstract_batch`` is the largest global batch the step can see, ``abstract_step_state`` the train state of a
model config; ``compile_step`` builds the jitted two-program step (``training.steps``) and compiles it against
them with their real shardings."""

from __future__ import annotations

from collections import Counter

import jax
import numpy as np

from longrm_jax import xla_log
# Modules, not their functions: what the plan compiles is what a test patches there (a poisoned step, a codec).
from longrm_jax.training import batches, model_setup, steps
from longrm_jax.training.state import abstract_state


def abstract_batch(cfg, mesh, slots: int | None) -> dict:
    """The largest global batch the step can see (``data.seq_len`` rows), as ShapeDtypeStructs on ``mesh``."""
    rows, length = cfg.pipeline_rows_per_step, (slots or 1) * cfg.data.seq_len
    host = {k: np.zeros((rows, length), np.int32) for k in ("input_ids", "positions", "segment_ids", "loss_mask")}
    host["num_groups"] = np.zeros((rows,), np.int32)
    prepared = batches.prepare(host, slots=slots)  # zigzag reordering keeps the shapes
    sh = batches.batch_shardings(mesh, slotted=slots is not None)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh[k]) for k, v in prepared.items()}


def abstract_step_state(cfg, mcfg, tx, mesh, key):
    """(abstract train state, its shardings) for the model config ``mcfg``."""
    return abstract_state(cfg, model_setup.codec_for(mcfg), tx, mesh, key)


def compile_step(cfg, mcfg, tx, schedule, spec, mesh, state, sh, batch: dict, xla_lines: Counter):
    """The compiled train step for model config ``mcfg`` on the abstract ``state`` (shardings ``sh``, from
    :func:`abstract_step_state`) and ``batch``; the compiler's out-of-memory refusal propagates. XLA's memory lines
    are counted into ``xla_lines``, not printed (``longrm_jax.xla_log``)."""
    step = steps.jit_train_step(steps.make_train_step(cfg, model_setup.codec_for(mcfg), tx, spec, schedule), sh,
                                batches.batch_shardings(mesh, slotted=spec.slotted))
    with jax.set_mesh(mesh), xla_log.quiet_xla_memory_lines(xla_lines):
        return step.compile(state, batch)
