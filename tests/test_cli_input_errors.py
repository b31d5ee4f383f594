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
    done = _cli("longrm_jax.data.synthetic", "--out", str(out), "--num-rejects", "3", "--num-values", "3")
    assert done.returncode == 2 and "--num-values 3: expected 4 (--num-rejects + 1) to 16" in done.stderr
    assert not out.exists()


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


def test_set_with_a_space_says_key_equals_value(tmp_path):
    done = _cli("longrm_jax.train", "--set", f"output_dir={tmp_path}", "--set", "optim.lr", "1e-3")
    assert done.returncode == 2
    assert "unrecognized arguments: 1e-3 (each --set takes one KEY=VALUE: --set optim.lr=1e-3)" in done.stderr
    done = _cli("longrm_jax.train", "--set", "steps", "--bogus")  # an unknown flag is not the --set's value
    assert done.returncode == 2 and done.stderr.rstrip().endswith("unrecognized arguments: --bogus")


def test_evaluate_topology_without_compile_only_exits_2():
    done = _cli("longrm_jax.evaluate", "--model-path", "x", "--topology", "v5p-8")
    assert done.returncode == 2 and "--compile-only and --topology go together" in done.stderr


def test_sft_logs_no_preference_metrics(tmp_path, capsys):
    """SFT has no chosen / rejected pair: its metrics carry no accuracy, rewards or margin (they were zeros).
    In-process: what is checked is what the run logs, which a subprocess would only add imports to."""
    import json

    from longrm_jax import train

    code = train.main(["--set", f"output_dir={tmp_path}", "--set", "stage=sft", "--set", "steps=2",
                       "--set", "tensorboard=false", "--set", "eval_before=false", "--set", "eval_after=false",
                       "--set", "data.num_train=16", "--set", "data.num_rejects=0", "--set", "progress=false"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows and all("loss" in r and not {"accuracy", "chosen_reward", "rejected_reward", "margin"} & set(r)
                        for r in rows)
    assert "accuracy" not in [line for line in out.splitlines() if line.startswith("step 2/2")][0]


def test_a_row_cut_short_is_named_without_json_decoders_own_line_count(tmp_path):
    from longrm_jax.data.readers import DataError, read_records

    path = tmp_path / "cut.jsonl"
    path.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b", \n')
    with pytest.raises(DataError) as e:
        read_records(str(path))
    assert str(e.value).endswith("cut.jsonl: line 2: invalid JSON (Expecting property name enclosed in double "
                                 "quotes at the end of the row (cut short?))")
    path.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b" "rejected": "c"}\n')
    with pytest.raises(DataError, match=r"line 2: invalid JSON \(Expecting ',' delimiter at character 31\)$"):
        read_records(str(path))


def test_training_output_to_a_file_gets_step_lines_not_a_bar(tmp_path):
    """progress null (the default): a bar only on a terminal; a log file gets one line per logged step."""
    done = _cli("longrm_jax.train", "--set", f"output_dir={tmp_path}", "--set", "steps=2", "--set", "tensorboard=false",
                "--set", "eval_before=false", "--set", "eval_after=false", "--set", "data.num_train=16")
    assert done.returncode == 0, done.stderr
    assert "step 2/2  loss" in done.stdout and "\r" not in done.stdout + done.stderr


def test_eval_source_takes_a_split_like_the_training_source(tmp_path):
    """data.eval_source=DIR:eval of a datasets save_to_disk directory (the shipped 8B configs' form) is read; a
    check of the whole string as a path used to refuse it as missing."""
    import datasets

    from longrm_jax.training.config import load_config
    from longrm_jax.training.data_source import eval_batches, load_tokenizer

    rows = {"prompt": ["a long document. question?"] * 4, "chosen": ["yes"] * 4, "rejected": ["no"] * 4}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "eval": datasets.Dataset.from_dict(rows)}
                         ).save_to_disk(str(tmp_path / "dsd"))
    cfg = load_config(None, [f"data.source={tmp_path / 'dsd'}:train", f"data.eval_source={tmp_path / 'dsd'}:eval"])
    assert eval_batches(cfg, load_tokenizer(cfg.data))
    cfg = load_config(None, [f"data.eval_source={tmp_path / 'missing.jsonl'}"])
    with pytest.raises(FileNotFoundError, match=r"^data.eval_source: .*missing.jsonl does not exist"):
        eval_batches(cfg, load_tokenizer(cfg.data))


# Issue 42 item 5: input errors that exited 1 (kept for bugs). In-process: a subprocess would add only imports.
@pytest.mark.parametrize("setting, message", [
    ("model.overrides.num_layer=3", "error: config + --set: model.overrides: unknown ModelConfig field 'num_layer'; "
                                    "did you mean num_layers?"),
    ("model.overrides.num_layers=0", "error: config + --set: model.overrides.num_layers must be an integer >= 1; "
                                     "got 0"),
])
def test_bad_model_overrides_exit_2_in_one_line_before_anything_runs(tmp_path, capsys, monkeypatch, setting,
                                                                      message):
    """num_layers=0 used to train, then fail saving ("Cannot save arrays with zero size", exit 1)."""
    from longrm_jax import train

    monkeypatch.delenv("LONGRM_DEBUG", raising=False)
    assert train.main(["--set", setting, "--set", f"output_dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "run").exists()


def test_synthetic_out_an_existing_file_exits_2_and_leaves_it(tmp_path, capsys, monkeypatch):
    """Was "error: [Errno 17] File exists: 'F'", exit 1."""
    from longrm_jax.data import synthetic

    monkeypatch.delenv("LONGRM_DEBUG", raising=False)
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    assert synthetic.main(["--out", str(existing), "--num-train", "2"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --out {existing}: is a file; a directory is needed (the files "
                                               "are written inside it)")
    assert synthetic.main(["--out", str(existing / "data")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --out {existing / 'data'}: {existing} is a file, not a directory"
    assert existing.read_text() == "mine" and os.listdir(tmp_path) == ["notes.txt"]
