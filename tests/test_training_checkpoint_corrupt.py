"""--resume with a corrupt newest checkpoint (issue 42 item 4): the bad step is named in one warning, kept aside
(never deleted) and the newest intact step is restored; with none intact, one line naming the directory and the
file, exit 2; corrupt metadata is reported as corruption, not as other settings (training.checkpoint_check);
checkpoint.on_corrupt=error refuses (exit 2) instead of falling back."""

import dataclasses
import logging
import os

import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax.models import ModelConfig
from longrm_jax.training.checkpoint import Checkpointer, completed_steps
from longrm_jax.training.checkpoint_check import (CorruptCheckpointError, find_resume_point, restore_newest_intact)
from longrm_jax.training.run_dir import ResumeMismatchError

MCFG = ModelConfig(vocab_size=8, hidden_size=4, intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                   head_dim=4)


@dataclasses.dataclass
class _State:
    params: dict


def _run_dir(tmp_path, steps=(2, 4)):
    """A checkpoint directory with ``steps``, step s holding :func:`_weights` (random: they do not compress)."""
    directory = str(tmp_path / "checkpoints")
    ck = Checkpointer(directory, keep=5, async_save=False)
    for step in steps:
        ck.save(step, _State({"w": jnp.asarray(_weights(step))}), {"batch": step}, {"run": 1}, MCFG)
    ck.close()
    return directory


def _weights(step):
    return np.random.default_rng(step).standard_normal((64, 64)).astype(np.float32)


def _resume(directory):
    point = find_resume_point(directory, completed_steps(directory))
    ckpt, state, data, step = restore_newest_intact(point, lambda: Checkpointer(directory, keep=5, async_save=False),
                                                    _State({"w": jnp.zeros((64, 64))}))
    return ckpt, state, data, step


def _largest_array_file(directory, step):
    files = [os.path.join(root, f) for root, _, names in os.walk(os.path.join(directory, str(step), "state"))
             for f in names if os.sep + "d" + os.sep in os.path.join(root, f)]
    return max(files, key=os.path.getsize)


def _corrupt(directory, step, how):
    base = os.path.join(directory, str(step))
    if how == "truncated array file":
        path = _largest_array_file(directory, step)
        with open(path, "r+b") as f:
            f.truncate(100)
    elif how == "data/metadata":
        with open(os.path.join(base, "data", "metadata"), "w") as f:
            f.write('{"broken')
    elif how == "empty state/_METADATA":
        open(os.path.join(base, "state", "_METADATA"), "w").close()


@pytest.mark.parametrize("how,said", [("truncated array file", "state/ cannot be read: "),
                                      ("data/metadata", "data/metadata is not valid JSON"),
                                      ("empty state/_METADATA", "state/_METADATA is empty")])
def test_corrupt_newest_step_resumes_from_the_previous_one_and_keeps_it_aside(tmp_path, caplog, how, said):
    directory = _run_dir(tmp_path)
    _corrupt(directory, 4, how)
    with caplog.at_level(logging.WARNING, logger="longrm_jax.training.checkpoint_check"):
        ckpt, state, data, step = _resume(directory)
    assert step == 2 and data == {"batch": 2} and np.array_equal(state.params["w"], _weights(2))
    first = caplog.records[0].getMessage()
    assert first.startswith(f"--resume: corrupt checkpoint in {directory} (step 4: {said}") and "\n" not in first
    assert "the newest intact step is 2" in first
    # Kept aside, never deleted; the resumed run can save step 4 again (orbax refuses a step that exists).
    aside = [d for d in os.listdir(directory) if d.startswith("corrupt-step-4-")]
    assert len(aside) == 1 and os.path.isdir(os.path.join(directory, aside[0], "state"))
    assert completed_steps(directory) == [2] and ckpt.latest_step() == 2
    ckpt.save(4, _State({"w": jnp.ones((64, 64))}), {"batch": 4}, {"run": 1}, MCFG)
    ckpt.close()
    assert completed_steps(directory) == [2, 4]


@pytest.mark.parametrize("how", ["truncated array file", "data/metadata"])
def test_no_intact_step_is_one_line_naming_directory_and_file_and_moves_nothing(tmp_path, how):
    directory = _run_dir(tmp_path, steps=(2,))
    _corrupt(directory, 2, how)
    with pytest.raises(CorruptCheckpointError) as err:
        _resume(directory)
    msg = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in msg and len(msg) < 700, msg
    bad_file = "data/metadata is not valid JSON" if how == "data/metadata" else "state/ cannot be read: "
    assert msg.startswith(f"cannot resume: no intact checkpoint in {directory} (step 2: "
                          f"{os.path.join(directory, '2', bad_file)}"), msg
    assert "TensorStore" not in msg and "does not fit" not in msg
    assert sorted(os.listdir(directory)) == ["2"]


def test_a_state_that_does_not_fit_is_still_a_settings_mismatch(tmp_path):
    directory = _run_dir(tmp_path, steps=(2,))
    point = find_resume_point(directory, [2])
    with pytest.raises(ResumeMismatchError, match=r"\(step 2\): its state does not fit this run's"):
        restore_newest_intact(point, lambda: Checkpointer(directory, keep=5, async_save=False),
                              _State({"w": jnp.zeros((8, 8)), "extra": jnp.zeros(3)}))
    assert sorted(os.listdir(directory)) == ["2"]


@pytest.mark.parametrize("how", ["truncated array file", "data/metadata"])
def test_on_corrupt_error_refuses_naming_the_bad_step_and_moves_nothing(tmp_path, how):
    """checkpoint.on_corrupt=error: the fallback above becomes a refusal (exit 2, as for no intact step), whether
    the step's metadata (checked first) or one of its arrays (read by the restore) is bad."""
    directory = _run_dir(tmp_path)
    _corrupt(directory, 4, how)
    before = sorted(os.listdir(directory))
    with pytest.raises(CorruptCheckpointError) as err:
        point = find_resume_point(directory, completed_steps(directory), on_corrupt="error")
        restore_newest_intact(point, lambda: Checkpointer(directory, keep=5, async_save=False),
                              _State({"w": jnp.zeros((64, 64))}))
    msg = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in msg and len(msg) < 800, msg
    assert msg.startswith(f"cannot resume: corrupt checkpoint in {directory} (step 4: {os.path.join(directory, '4')}")
    assert "Older steps there: 2;" in msg and "checkpoint.on_corrupt=fallback" in msg
    assert "TensorStore" not in msg
    assert sorted(os.listdir(directory)) == before == ["2", "4"]


def test_on_corrupt_error_still_resumes_when_only_an_older_step_is_bad(tmp_path):
    # Nothing is lost by resuming from the newest step, so there is nothing to refuse.
    directory = _run_dir(tmp_path)
    _corrupt(directory, 2, "data/metadata")
    point = find_resume_point(directory, completed_steps(directory), on_corrupt="error")
    ckpt, state, data, step = restore_newest_intact(
        point, lambda: Checkpointer(directory, keep=5, async_save=False), _State({"w": jnp.zeros((64, 64))}))
    ckpt.close()
    assert step == 4 and np.array_equal(state.params["w"], _weights(4))
