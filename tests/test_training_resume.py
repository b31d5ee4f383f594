"""Checkpoints: SIGKILL (during an async save) then --resume ends bit-identical to an uninterrupted run; a NaN
loss stops the run naming the step and keeps the last good checkpoint."""

import dataclasses
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training import steps
from longrm_jax.training import loop
from longrm_jax.training import step_groups
from longrm_jax.training.checkpoint import load_trained_weights
from longrm_jax.training.config import load_config
from helpers.train_and_kill import run_train_cli

TINY = ["data.seq_len=256", "data.batch_rows=2", "data.synthetic.lengths=[24,40]", "data.num_train=16",
        "steps=6", "checkpoint.every=2", "eval_before=false", "eval_after=false", "tensorboard=false",
        "progress=false", "optim.lr=1e-2"]


def _train(out, *extra, kill_at=None):
    """The training CLI in a subprocess; ``kill_at=(event, step)`` SIGKILLs it there (tests/helpers)."""
    return run_train_cli(TINY + [f"output_dir={out}"], *extra, kill_at=kill_at, timeout=300)


@pytest.mark.slow
def test_sigkill_during_async_save_then_resume_is_bit_identical(tmp_path):
    ref = _train(tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    killed = _train(tmp_path / "run", kill_at=("saving", 4))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # The interrupted save never became the latest complete step: step 2 (or 4 if it had finished) restores.
    mcfg, params = load_trained_weights(str(tmp_path / "run" / "checkpoints"))
    assert all(np.isfinite(v).all() for v in params.values())
    resumed = _train(tmp_path / "run", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    _, want = load_trained_weights(str(tmp_path / "ref" / "checkpoints"), 6)
    _, got = load_trained_weights(str(tmp_path / "run" / "checkpoints"), 6)
    assert set(want) == set(got)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "checkpoint.async_save=false"], base=DEFAULT_CONFIG)
    real = steps.make_train_step

    def poisoned(*args):
        inner = real(*args)

        def gradients(state, batch):  # step 3 sees NaN weights: its loss and gradients are NaN
            bad = jax.tree.map(lambda p: jnp.where(state.step == 2, jnp.nan, p), state.params)
            return inner.gradients(state.replace(params=bad), batch)

        return dataclasses.replace(inner, gradients=gradients)

    monkeypatch.setattr(step_groups, "make_train_step", poisoned)  # a step compiled for more groups per row
    monkeypatch.setattr(steps, "make_train_step", poisoned)  # the step the trainer compiles before loading
    events = []
    with pytest.raises(loop.NonFiniteLossError, match=r"at step 3.*Last good checkpoint: step 2"):
        loop.run(cfg, on_step=lambda step, event: events.append((step, event)))
    assert events == [(1, "trained"), (2, "trained"), (2, "saving")]  # the callback tests inject faults with
    _, params = load_trained_weights(str(tmp_path / "checkpoints"))
    assert all(np.isfinite(v).all() for v in params.values())
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
