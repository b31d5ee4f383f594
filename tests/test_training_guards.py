"""Runs that used to finish with exit 0 and a wrong or useless result: degenerate data (chosen == rejected
after truncation), a file source without held-out pairs, two runs sharing one output_dir; and the one-line
messages of ``python -m longrm_jax.train``."""

import json
import os
import socket
import subprocess
import sys

import pytest

from longrm_jax.data.packing import pack_batches
from longrm_jax.data.records import PreferenceRecord, Provenance
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
from longrm_jax.data.tokenize import ChatTokenizer, TruncationStats
from longrm_jax.train import DEFAULT_CONFIG, main
from longrm_jax.training import loop
from longrm_jax.training.config import load_config
from longrm_jax.training.data_source import degenerate_groups
from longrm_jax.training.run_lock import LOCK_NAME, RunDirLockedError, RunLock

TINY = ["data.batch_rows=2", "data.num_train=4", "steps=1", "eval_before=false", "eval_after=false",
        "tensorboard=false", "progress=false"]


def test_identical_pairs_are_dropped_by_the_packer_and_counted():
    """The packer drops a group whose rejected equals its chosen (counted, logged); the trainer's own check
    (degenerate_groups) then sees only trainable groups."""
    tok = ChatTokenizer.from_dir(TINY_TOKENIZER_DIR)
    prompt = ({"role": "user", "content": "Which is better?"},)
    same = PreferenceRecord(prompt, "the same answer", ("the same answer",), Provenance("t", 0))
    differ = PreferenceRecord(prompt, "a good answer", ("a bad answer",), Provenance("t", 1))
    groups = [tok.tokenize(r, 1) for r in (same, differ, same)]
    stats = TruncationStats()
    (batch,) = pack_batches(groups, (512,), 1, 2, tok.pad_id, tok.eos_id, "right", stats)
    assert stats.as_dict()["identical_pairs_dropped"] == 2
    assert degenerate_groups(batch, 2) == (0, 1)


def test_rows_truncated_to_identical_pairs_stop_the_run(tmp_path, capsys):
    # Haystacks of 400 tokens in rows of 128, cut on the right (upstream's literal rule): only the shared prompt
    # is left, so chosen == rejected and every pair is dropped. This used to train with margin 1e-6 and
    # accuracy 0, exit 0 (and, once such pairs were dropped, to wait forever for a first batch).
    args = ["--set", "data.seq_len=128", "--set", "data.synthetic.lengths=[400]", "--set", "data.truncation=right"] + \
        [x for kv in TINY for x in ("--set", kv)] + ["--set", f"output_dir={tmp_path / 'run'}"]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: a whole pass over the 4 training records gave no batch to train on (counted so far:")
    assert "identical_pairs_dropped" in err and "data.truncation 'right', rows of 128 tokens): raise data.seq_len, use " \
        "data.truncation prompt_middle" in err
    assert not os.path.exists(tmp_path / "run" / LOCK_NAME)  # released on the error path


def test_long_prompts_are_cut_in_the_middle_and_train(tmp_path):
    """The same rows with the default cut (prompt_middle): every pair keeps its responses and trains."""
    cfg = load_config(None, ["data.seq_len=128", "data.synthetic.lengths=[400]", f"output_dir={tmp_path}"] + TINY,
                      base=DEFAULT_CONFIG)
    result = loop.run(cfg)
    assert result.final_step == 1 and result.last_metrics["loss"] > 0


def test_file_source_without_eval_source_says_so(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    rows = [{"chat_template": [{"role": "user", "content": f"Question {i}?"}], "chosen": f"good {i}",
             "rejects": [f"bad {i} " * 3]} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [x for kv in TINY + ["eval_after=true", f"data.source={data}", "data.seq_len=256",
                                f"output_dir={tmp_path / 'run'}"] for x in ("--set", kv)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (f"pairwise accuracy on held-out pairs: not measured (no held-out pairs: data.source {data} has no "
            "held-out split and data.eval_source is unset (set it to a held-out file to measure pairwise "
            "accuracy))") in out.splitlines()


def test_empty_training_file_names_the_file(tmp_path, capsys):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    assert main(["--set", f"data.source={data}", "--set", f"output_dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err == f"error: {data}: no preference records (the file or split is empty)\n"
    assert not (tmp_path / "run").exists()  # the failed run leaves no empty output_dir behind
    (tmp_path / "mine").mkdir()
    assert main(["--set", f"data.source={data}", "--set", f"output_dir={tmp_path / 'mine'}"]) == 2
    assert (tmp_path / "mine").is_dir()  # a directory the user made stays


def test_second_run_on_the_same_output_dir_is_refused(tmp_path):
    out = tmp_path / "run"
    with RunLock(str(out)):
        cfg = load_config(None, TINY + ["data.seq_len=256", f"output_dir={out}"], base=DEFAULT_CONFIG)
        with pytest.raises(RunDirLockedError, match=rf"^{out} is in use by another training run \(pid {os.getpid()} "
                                                   rf"on {socket.gethostname()}, started .*\): wait for it"):
            loop.run(cfg)
        assert not (out / "checkpoints").exists()  # nothing of the first run touched
    assert not (out / LOCK_NAME).exists()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "then"}))
    with RunLock(str(tmp_path)) as lock:
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid() and lock.held
    assert any(f"taking over the lock of run pid {pid}" in r.getMessage() for r in caplog.records)
    # Another host's lock cannot be checked: refused.
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": "elsewhere", "started": "then"}))
    with pytest.raises(RunDirLockedError, match=f"pid {pid} on elsewhere"):
        RunLock(str(tmp_path)).acquire()


@pytest.mark.slow  # a subprocess: the tensorboardX noise came at interpreter exit
def test_train_cli_error_is_one_line_without_tensorboard_noise(tmp_path):
    """An error after the metrics writer opened used to end in a tensorboardX "can't create new thread at
    interpreter shutdown" traceback; now the whole stderr is the one line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("LONGRM_DEBUG", None)
    missing = tmp_path / "missing"
    done = subprocess.run([sys.executable, "-m", "longrm_jax.train", "--set", f"output_dir={tmp_path / 'run'}",
                           "--set", f"model.init={missing}", "--set", "data.num_train=4", "--set", "steps=1"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: model.init: {missing} is not a directory (HF checkpoint or training "
                                  "checkpoint); ") and done.stderr.count("\n") == 1
    assert not os.path.exists(tmp_path / "run" / LOCK_NAME)


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    with pytest.raises(ValueError, match="no preference records"):
        main(["--set", f"data.source={data}", "--set", f"output_dir={tmp_path / 'run'}", "--debug"])
    monkeypatch.setenv("LONGRM_DEBUG", "1")
    with pytest.raises(ValueError, match="no preference records"):
        main(["--set", f"data.source={data}", "--set", f"output_dir={tmp_path / 'run'}"])


def test_no_batch_advice_names_only_what_would_change_something():
    """Issue 42 item 6: the advice suggested data.truncation prompt_middle when it was already set, and a longer
    row when the pairs were identical in the data itself."""
    from longrm_jax.data.pipeline import no_batch_advice

    cut = {"truncated_samples": 4, "identical_pairs_dropped": 4}
    assert no_batch_advice(cut, "right").startswith("raise data.seq_len, use data.truncation prompt_middle, or ")
    assert no_batch_advice(cut, "prompt_middle").startswith("raise data.seq_len, or check the data")
    same = no_batch_advice({"truncated_samples": 0, "identical_pairs_dropped": 4}, "prompt_middle")
    assert same.startswith("every preference group's rejected response equals its chosen one although no sequence")
    assert "data.seq_len" not in same and "prompt_middle" not in same
