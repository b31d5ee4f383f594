"""Bad input on the command line is refused with exit status 2 and a message naming the flag, key or file
(README, "Exit status"), before anything is written; found by a new user's walk through the README."""

import os
import subprocess
import sys

import pytest


def _cli(*args, cwd=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("LONGRM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


def test_synthetic_refuses_a_negative_count_before_writing(tmp_path):
    out = tmp_path / "data"
    done = _cli("longrm_jax.data.synthetic", "--out", str(out), "--num-train", "-3")
    assert done.returncode == 2 and "--num-train -3: expected an integer >= 0" in done.stderr
    assert not out.exists()
    done = _cli("longrm_jax.data.synthetic", "--out", str(out), "--lengths", "64,0")
    assert done.returncode == 2 and "--lengths 0: expected an integer >= 1" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--set", "model.preset=tiny_qwen"], "model.preset 'tiny_qwen' unknown; presets: "),
    (["--set", "model.compute_dtype=fp32"], "model.compute_dtype must be float32 or bfloat16; got 'fp32'"),
    (["--topology", "v5p-8"], "--compile-only and --topology go together"),
])
def test_train_input_errors_exit_2(tmp_path, args, message):
    done = _cli("longrm_jax.train", "--set", f"output_dir={tmp_path / 'run'}", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_missing_step_folder_lists_the_steps_there(tmp_path):
    """export of a step that `checkpoint.keep` pruned names the steps that exist."""
    ckpt = tmp_path / "checkpoints"
    for step in (200, 230):
        os.makedirs(ckpt / str(step) / "state")
    done = _cli("longrm_jax.export", "--checkpoint", str(ckpt / "150"), "--out", str(tmp_path / "hf"))
    assert done.returncode == 2
    assert f"{ckpt} holds steps 200, 230" in done.stderr


def test_unknown_task_lists_the_task_files(tmp_path):
    from longrm_jax.evaluation.samples import BenchDataError, discover_task_files

    for task in ("LongQA", "Safety"):
        (tmp_path / f"{task}.jsonl").write_text("")
    with pytest.raises(BenchDataError, match="LongQ.jsonl; --tasks can name LongQA, Safety"):
        discover_task_files(str(tmp_path), ["LongQ"])
