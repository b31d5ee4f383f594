"""A run's output_dir across reruns, resumes and interrupts (issue 29): a rerun with checkpoint.overwrite keeps the
previous run until it has a checkpoint of its own; SIGINT/SIGTERM save the step reached; a refused --resume names
the settings and leaves the run record alone; a resume drops the metrics of the steps it replays; the console
shows step lines without a progress bar and an end-of-run summary."""

import functools
import json
import os
import pathlib
import signal
import struct

import pytest

from longrm_jax import train
from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training import loop
from longrm_jax.training.checkpoint import completed_steps
from longrm_jax.training.config import load_config
from longrm_jax.training.run_dir import PREVIOUS_PREFIX
from helpers.train_and_kill import run_train_cli

TINY = ["data.seq_len=256", "data.batch_rows=2", "data.synthetic.lengths=[24,40]", "data.num_train=16",
        "steps=4", "checkpoint.every=2", "eval_before=false", "eval_after=false", "tensorboard=false",
        "progress=false", "optim.lr=1e-2", "checkpoint.async_save=false", "checkpoint.keep=5"]


def _args(out, *extra):
    return [a for s in TINY + [f"output_dir={out}", *extra] for a in ("--set", s)]


def _snapshot(out) -> dict:
    """Every file under ``out`` (the lock excluded) -> its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(pathlib.Path(out).rglob("*"))
            if p.is_file() and p.name != ".run.lock"}


def _rows(out, split="train"):
    lines = (pathlib.Path(out) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if json.loads(line)["split"] == split]


class _Fail(Exception):
    pass


def _fail_at(step_to_fail, step, event):
    if event == "trained" and step == step_to_fail:
        raise _Fail(f"injected failure at step {step}")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 4-step run (checkpoints 2 and 4, metrics rows 1..4): what each test reruns over, copied."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert train.main(_args(out, "log_every=1", "tensorboard=true")) == 0
    return out


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_rerun_stopped_by_the_memory_plan_keeps_the_previous_run(finished_run, tmp_path, capsys):
    """The issue's recipe: a rerun with overwrite that stops at the memory plan used to leave no checkpoints."""
    out = _copy(finished_run, tmp_path / "run")
    before = _snapshot(out)
    assert train.main(_args(out, "checkpoint.overwrite=true", "memory_budget_gib=0.01")) == 4
    assert "error: the train step does not fit the device" in capsys.readouterr().err
    assert _snapshot(out) == before  # checkpoints, metrics.jsonl, config.yaml: all as they were


def test_rerun_failing_before_its_first_checkpoint_leaves_the_previous_run_aside(finished_run, tmp_path,
                                                                                 monkeypatch, capsys):
    out = _copy(finished_run, tmp_path / "run")
    before = _snapshot(out)
    cfg = load_config(None, TINY + [f"output_dir={out}", "checkpoint.overwrite=true"], base=DEFAULT_CONFIG)
    with pytest.raises(_Fail):
        loop.run(cfg, on_step=functools.partial(_fail_at, 1))
    (aside,) = [p for p in out.iterdir() if p.name.startswith(PREVIOUS_PREFIX)]
    assert f"moved to {aside}" in capsys.readouterr().out
    moved = _snapshot(aside)
    assert moved == before  # the whole previous run, byte for byte
    assert completed_steps(str(aside / "checkpoints")) == [2, 4]


def test_rerun_replaces_the_previous_run_once_it_has_a_checkpoint(finished_run, tmp_path, capsys):
    """... and, with progress=false, prints a line per logged step and the end-of-run summary."""
    out = _copy(finished_run, tmp_path / "run")
    assert train.main(_args(out, "checkpoint.overwrite=true", "steps=2", "log_every=1")) == 0
    stdout = capsys.readouterr().out
    assert "previous run deleted" in stdout
    assert not [p for p in out.iterdir() if p.name.startswith(PREVIOUS_PREFIX)]
    assert completed_steps(str(out / "checkpoints")) == [2]
    assert [r["step"] for r in _rows(out)] == [1, 2]
    assert not (out / "tensorboard").exists()  # the old run's event files went with it (this run has none)
    lines = stdout.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/2", "2/2"]
    assert all("loss " in line and "tokens_per_s " in line for line in steps)
    (summary,) = [line for line in lines if line.startswith("summary: ")]
    assert summary.startswith("summary: 2 steps, final loss ")
    assert "held-out accuracy not measured" in summary and "wall time " in summary and " tokens/s " in summary
    assert summary.endswith("checkpoint steps 2")


def test_summary_line_names_accuracy_speed_and_checkpoints():
    result = loop.RunResult(final_step=60, start_step=31, accuracy_before=None, accuracy_after=0.9375,
                            last_metrics={"loss": 0.12345}, wall_s=83.21, tokens=5000, train_s=2.0,
                            timed_tokens=4000, saved_steps=[50, 60])
    assert train.run_summary(result) == (
        "summary: 60 steps (29 in this run, resumed at 31), final loss 0.1235, held-out accuracy n/a -> 93.8%, "
        "wall time 83.2 s, 2,000 tokens/s (steps after the first, which compiles); checkpoint steps 50, 60")


def test_set_aside_keeps_records_without_overwrite_and_moves_step_folders_of_an_output_dir_checkpoint(tmp_path):
    from longrm_jax.training.run_dir import set_aside_previous_run

    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    kept = set_aside_previous_run(str(out), str(out / "checkpoints"), has_checkpoint=False, overwrite=False)
    (place,) = kept.places
    assert sorted(os.listdir(place)) == ["metrics.jsonl", "tensorboard"] and not (out / "metrics.jsonl").exists()
    kept.release_if_replaced(True)
    assert os.path.isdir(place)  # a run without checkpoint.overwrite deletes nothing
    # checkpoint.dir == output_dir: the step folders move, the run directory (and its lock) stay.
    other = tmp_path / "flat"
    (other / "3" / "state").mkdir(parents=True)
    (other / ".run.lock").write_text("{}")
    moved = set_aside_previous_run(str(other), str(other), has_checkpoint=True, overwrite=True)
    assert os.listdir(os.path.join(moved.places[0], "checkpoints")) == ["3"] and (other / ".run.lock").exists()
    moved.release_if_replaced(True)
    assert not os.path.exists(moved.places[0])


def test_rerun_without_overwrite_is_refused_before_anything_moves(finished_run, tmp_path, capsys):
    out = _copy(finished_run, tmp_path / "run")
    before = _snapshot(out)
    assert train.main(_args(out, "checkpoint.overwrite=false")) == 2
    assert "already holds checkpoints of an earlier run" in capsys.readouterr().err
    assert _snapshot(out) == before


def test_resume_with_other_settings_names_them_and_keeps_the_run_record(finished_run, tmp_path, capsys):
    out = _copy(finished_run, tmp_path / "run")
    before = _snapshot(out)
    code = train.main(_args(out, "stage=bt", "data.batch_rows=4", "lora.rank=2", "steps=6") + ["--resume"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1 and len(err) < 700, err
    assert err.startswith(f"error: cannot resume from {out / 'checkpoints'} (step 4): it was trained with other "
                          "settings: data.batch_rows 2 -> 4; lora.rank 0 -> 2; stage 'simpo' -> 'bt'")
    assert _snapshot(out) == before  # config.yaml still says simpo


def _event_steps_and_purges(tb_dir) -> list[tuple[str, int]]:
    """(kind, step) of every event in the TensorBoard files of ``tb_dir``, file by file in write order."""
    from tensorboardX.proto.event_pb2 import Event

    out = []
    for path in sorted(pathlib.Path(tb_dir).iterdir(), key=lambda p: p.stat().st_mtime_ns):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i:i + 8])
            event = Event.FromString(data[i + 12:i + 12 + length])
            i += 12 + length + 4
            out.append(("version", event.step) if event.file_version else ("scalar", event.step))
    return out


def test_resume_logs_changed_settings_and_drops_replayed_metrics(finished_run, tmp_path, capsys):
    """A run whose newest complete checkpoint is step 2 but whose metrics reach step 4 (killed while saving step
    4): the resume replays steps 3 and 4. metrics.jsonl then holds each step once, TensorBoard is told to purge
    steps >= 3, and the changed lr and step count are logged."""
    import shutil

    out = _copy(finished_run, tmp_path / "run")
    shutil.rmtree(out / "checkpoints" / "4")
    assert [r["step"] for r in _rows(out)] == [1, 2, 3, 4]
    assert train.main(_args(out, "steps=5", "log_every=1", "tensorboard=true", "optim.lr=5e-3") + ["--resume"]) == 0
    stdout = capsys.readouterr().out
    (changed,) = [line for line in stdout.splitlines() if line.startswith("resuming step 2 with settings changed")]
    assert "optim.lr: 0.01 -> 0.005; " in changed and "steps: 4 -> 5" in changed  # (output_dir too: a copy)
    assert [r["step"] for r in _rows(out)] == [1, 2, 3, 4, 5]
    events = _event_steps_and_purges(out / "tensorboard")
    assert ("version", 3) in events  # the resumed writer's purge marker (tensorboardX purge_step)
    assert "summary: 5 steps (3 in this run, resumed at 2)" in stdout


def test_sigint_saves_the_step_reached_and_exits_130(tmp_path, monkeypatch, capsys):
    def interrupt_at_3(step, event):
        if event == "trained" and step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(loop, "run", functools.partial(loop.run, on_step=interrupt_at_3))
    out = tmp_path / "run"
    # The handlers this process had: a suite started in the background by a non-interactive shell (`cmd &`)
    # inherits SIGINT ignored, and the trainer must put back exactly that.
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert train.main(_args(out, "steps=10", "checkpoint.every=4")) == 130
    err = capsys.readouterr().err
    assert err == (f"interrupted by SIGINT: stopped after step 3 of 10, checkpoint of step 3 saved in "
                   f"{out / 'checkpoints'}; continue with --resume\n")
    assert completed_steps(str(out / "checkpoints")) == [3]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handlers put back


def _cli(out, *extra, signal_at=None):
    sets = TINY + [f"output_dir={out}", "steps=60", "checkpoint.every=50", "log_every=1", "checkpoint.async_save=true"]
    return run_train_cli(sets, *extra, kill_at=signal_at)


@pytest.mark.slow
def test_sigterm_at_step_31_saves_it_and_resume_is_bit_identical(tmp_path):
    """The issue's case: SIGTERM at step 31 of 60 with checkpoint.every=50 used to save nothing."""
    ref = _cli(tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    stopped = _cli(tmp_path / "run", signal_at=("trained:SIGTERM", 31))
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert stopped.stderr.splitlines()[-1] == (
        f"interrupted by SIGTERM: stopped after step 31 of 60, checkpoint of step 31 saved in "
        f"{tmp_path / 'run' / 'checkpoints'}; continue with --resume")
    assert completed_steps(str(tmp_path / "run" / "checkpoints")) == [31]
    resumed = _cli(tmp_path / "run", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "at step 31" in resumed.stdout
    want = [(r["step"], r["loss"]) for r in _rows(tmp_path / "ref")]
    got = [(r["step"], r["loss"]) for r in _rows(tmp_path / "run")]
    assert got == want  # steps 1..60 once each, every loss bit-identical (JSON keeps a float's repr)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_rerun_interrupted_at_step_2_keeps_the_finished_run_until_its_resume_replaces_it(
        finished_run, tmp_path, monkeypatch, capsys, sig):
    """Issue 42's repro: a finished run, a rerun of it (overwrite), Ctrl-C at step 2. The interrupt's save of
    step 2 used to count as the rerun's first checkpoint and the finished run was deleted. Now it stays aside;
    the rerun's --resume replaces it at its first scheduled checkpoint (every=4 here), and nothing piles up."""
    out = _copy(finished_run, tmp_path / "run")
    before = _snapshot(out)

    def interrupt_at_2(step, event):
        if event == "trained" and step == 2:
            os.kill(os.getpid(), sig)

    rerun = _args(out, "checkpoint.overwrite=true", "steps=8", "checkpoint.every=4")
    with monkeypatch.context() as patch:
        patch.setattr(loop, "run", functools.partial(loop.run, on_step=interrupt_at_2))
        assert train.main(rerun) == 128 + sig
    stdout = capsys.readouterr().out
    (aside,) = [p for p in out.iterdir() if p.name.startswith(PREVIOUS_PREFIX)]
    assert f"previous run kept in {aside}" in stdout and "previous run deleted" not in stdout
    assert _snapshot(aside) == before  # the finished run, whole
    assert completed_steps(str(out / "checkpoints")) == [2]  # the rerun's interrupt save, beside it

    assert train.main(rerun + ["--resume"]) == 0
    stdout = capsys.readouterr().out
    assert f"previous run deleted ({aside})" in stdout
    assert not [p for p in out.iterdir() if p.name.startswith(PREVIOUS_PREFIX)]
    assert completed_steps(str(out / "checkpoints"))[-1] == 8


def test_a_fresh_rerun_takes_earlier_set_aside_runs_along(finished_run, tmp_path, monkeypatch, capsys):
    """Reruns stopped before a scheduled checkpoint, then a fresh rerun: every run set aside goes when the last
    rerun has a checkpoint of its own (one deletion), not one folder per attempt left behind."""
    out = _copy(finished_run, tmp_path / "run")

    def fail_at_1(step, event):
        if event == "trained" and step == 1:
            raise _Fail("stop")

    cfg = load_config(None, TINY + [f"output_dir={out}", "checkpoint.overwrite=true"], base=DEFAULT_CONFIG)
    with pytest.raises(_Fail):
        loop.run(cfg, on_step=fail_at_1)
    (first,) = [p for p in out.iterdir() if p.name.startswith(PREVIOUS_PREFIX)]
    (out / "metrics.jsonl").write_text("{}\n")  # what the failed attempt left: records to set aside again
    assert train.main(_args(out, "checkpoint.overwrite=true", "steps=2")) == 0
    stdout = capsys.readouterr().out
    assert f"with the runs set aside before it: {first}" in stdout
    assert "previous run deleted" in stdout
    assert not [p for p in out.iterdir() if p.name.startswith(PREVIOUS_PREFIX)]
