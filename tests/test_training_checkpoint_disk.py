"""Checkpoint saves check the disk first: "error" stops before writing, "delete_oldest" makes room."""

import collections
import dataclasses
import os
import shutil

import jax.numpy as jnp
import pytest

from longrm_jax.models import ModelConfig
from longrm_jax.training import checkpoint as ckpt_lib


@dataclasses.dataclass
class _State:
    params: dict


def _fake_disk(monkeypatch, free_bytes):
    """disk_usage reports `free_bytes()` free."""
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(ckpt_lib.shutil, "disk_usage", lambda path: usage(1 << 40, 0, free_bytes()))


_MCFG = ModelConfig(vocab_size=8, hidden_size=4, intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                    head_dim=4)


def _save(ck, step):
    ck.save(step, _State({"w": jnp.ones((256, 256))}), {"i": step}, {"run": 1}, _MCFG)
    ck.wait()


def test_low_disk_error_names_sizes_and_knobs_before_writing(tmp_path, monkeypatch):
    ck = ckpt_lib.Checkpointer(str(tmp_path / "c"), keep=2, async_save=False)
    _save(ck, 1)
    _fake_disk(monkeypatch, lambda: 1 << 20)  # 1 MB free: less than the 64 MB margin
    with pytest.raises(ckpt_lib.CheckpointDiskError, match=r"checkpoint step 2 needs about .* GB.*on_low_disk"):
        _save(ck, 2)
    assert ck.manager.all_steps() == [1]  # nothing written, nothing deleted
    ck.close()


def test_delete_oldest_makes_room_then_saves(tmp_path, monkeypatch, caplog):
    ck = ckpt_lib.Checkpointer(str(tmp_path / "c"), keep=3, async_save=False, on_low_disk="delete_oldest")
    _save(ck, 1)
    _save(ck, 2)
    real = shutil.disk_usage
    # "Free" space grows once step 1 is gone: enough for one more checkpoint only then.
    _fake_disk(monkeypatch, lambda: (1 << 30) if 1 not in ck.manager.all_steps() else (1 << 20))
    with caplog.at_level("WARNING"):
        _save(ck, 3)
    assert ck.manager.all_steps() == [2, 3]
    assert "deleting step 1 first" in caplog.text
    monkeypatch.setattr(ckpt_lib.shutil, "disk_usage", real)
    ck.close()


def test_delete_oldest_frees_a_previous_run_set_aside_first(tmp_path, monkeypatch, caplog):
    """A rerun with checkpoint.overwrite keeps the previous run aside until its first checkpoint exists; on a disk
    that cannot hold both, delete_oldest deletes that previous run first (and "error" says so)."""
    from longrm_jax.training.run_dir import SetAside

    old = tmp_path / "run" / "previous_run-x"
    (old / "checkpoints").mkdir(parents=True)
    aside = SetAside(places=[str(old)], delete_when_replaced=True)
    ck = ckpt_lib.Checkpointer(str(tmp_path / "run" / "c"), keep=2, async_save=False)
    ck.reclaim = aside.release_now
    _fake_disk(monkeypatch, lambda: (1 << 30) if not old.exists() else (1 << 20))
    with pytest.raises(ckpt_lib.CheckpointDiskError, match="moved aside by checkpoint.overwrite"):
        _save(ck, 1)
    assert old.exists()  # the "error" policy deletes nothing
    ck.on_low_disk = "delete_oldest"
    with caplog.at_level("WARNING"):
        _save(ck, 1)
    assert not old.exists() and ck.manager.all_steps() == [1]
    assert f"deleted the previous run set aside in {old} first" in caplog.text
    ck.close()


def test_bad_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="on_low_disk"):
        ckpt_lib.Checkpointer(str(tmp_path / "c"), on_low_disk="sometimes")


def test_bounded_host_memory_save_restores_the_same_state(tmp_path):
    """checkpoint.save_host_gb: orbax's PyTree handler with capped host buffers; same values back."""
    import numpy as np

    ck = ckpt_lib.Checkpointer(str(tmp_path / "c"), keep=2, async_save=True, save_host_gb=1)
    state = _State({"w": jnp.arange(4096.0).reshape(64, 64), "b": jnp.ones((3,), jnp.bfloat16)})
    ck.save(1, state, {"i": 1}, {"run": 1}, ModelConfig(vocab_size=8, hidden_size=4, intermediate_size=8,
                                                          num_layers=1, num_heads=1, num_kv_heads=1, head_dim=4))
    ck.wait()
    back, data, step = ck.restore(_State({"w": jnp.zeros((64, 64)), "b": jnp.zeros((3,), jnp.bfloat16)}))
    assert step == 1 and data == {"i": 1}
    np.testing.assert_array_equal(back.params["w"], state.params["w"])
    assert back.params["b"].dtype == jnp.bfloat16
    ck.close()
    # The other tools read it like any checkpoint (same on-disk format).
    assert ckpt_lib.is_training_checkpoint(str(tmp_path / "c"))


def test_saves_are_synchronous_when_the_step_keeps_pinned_host_memory(capsys):
    """checkpoint.async_save null: an asynchronous save's host copy of the state would sit beside the step's pinned
    buffers, so a step with pinned host memory (offloaded activations or moments) saves before the next step runs;
    an explicit setting wins."""
    from longrm_jax.training.config import load_config
    from longrm_jax.training.loop import _async_save
    from longrm_jax.training.memory_plan import GiB, ProgramMemory

    def plan(host):
        return collections.namedtuple("Plan", "programs")([ProgramMemory("gradients", 0, 0, 0, 0, 0, host)])

    cfg = load_config(None, ["checkpoint.every=10"])
    assert cfg.checkpoint.async_save is None
    assert _async_save(cfg, plan(0)) is True and capsys.readouterr().out == ""
    assert _async_save(cfg, plan(int(48.5 * GiB))) is False
    assert "48.5 GiB of pinned host memory" in capsys.readouterr().out
    for explicit in (True, False):
        cfg = load_config(None, ["checkpoint.every=10", f"checkpoint.async_save={str(explicit).lower()}"])
        assert _async_save(cfg, plan(int(48.5 * GiB))) is explicit


def test_resume_of_an_older_run_does_not_report_settings_that_became_automatic(capsys):
    """Runs saved before checkpoint.async_save and progress defaulted to null (automatic) say true there; a resume
    with nothing changed by the user reports no change, while a real change is still reported."""
    from longrm_jax.training.run_dir import check_resume_compatible

    saved = {"checkpoint": {"async_save": True, "every": 10}, "progress": True, "optim": {"lr": 1e-5}}
    current = {"checkpoint": {"async_save": None, "every": 10}, "progress": None, "optim": {"lr": 1e-5}}
    assert check_resume_compatible(saved, current, "ckpt", 2) == []
    current["optim"]["lr"] = 2e-5
    current["progress"] = False
    assert check_resume_compatible(saved, current, "ckpt", 2) == ["optim.lr: 1e-05 -> 2e-05", "progress: True -> False"]


def test_a_failed_save_leaves_no_orbax_tmp_directory(tmp_path):
    """A save that raises (issue 42: zero-size arrays of a model with num_layers=0) left
    ``<step>.orbax-checkpoint-tmp`` beside the kept steps until the next run started."""
    ck = ckpt_lib.Checkpointer(str(tmp_path / "c"), keep=2, async_save=False)
    _save(ck, 1)
    with pytest.raises(ValueError, match="zero size"):
        ck.save(2, _State({"w": jnp.zeros((0, 4))}), {"i": 2}, {"run": 1}, _MCFG)
    ck.close()
    assert sorted(os.listdir(tmp_path / "c")) == ["1"]


def test_an_asynchronous_save_failing_while_writing_leaves_no_tmp_directory(tmp_path, monkeypatch):
    ck = ckpt_lib.Checkpointer(str(tmp_path / "c"), keep=2, async_save=False)
    _save(ck, 1)
    os.makedirs(tmp_path / "c" / "2.orbax-checkpoint-tmp-1234")  # what the failed background write left

    def failed():
        raise OSError("No space left on device")

    monkeypatch.setattr(ck.manager, "wait_until_finished", failed)
    with pytest.raises(OSError, match="No space left"):
        ck.wait()
    assert sorted(os.listdir(tmp_path / "c")) == ["1"]
    monkeypatch.undo()
    ck.close()
