"""One exit-status scheme over every CLI (README, "Exit status"; longrm_jax.cli_support): 0 done, 2 input
refused, 3 training stopped on its data or loss (evaluate: no verdict parsed), 4 a program or batch does not
fit, 1 only for bugs. A table of bad inputs, one per row, each run in-process through the CLI's own ``main``
and held to its status and to one ``error:`` line that names what is wrong (never a traceback)."""

import json

import pytest

from longrm_jax import evaluate, export, launch, score, train
from longrm_jax.data import inspect_data, synthetic

CLIS = {"train": train.main, "evaluate": evaluate.main, "export": export.main, "synthetic": synthetic.main,
        "inspect": inspect_data.main, "launch": launch.main, "score": score.main}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Inputs the table refers to by name: an existing plain file, an empty directory, a broken YAML config, a
    data file with a bad row, a model directory with a bad config.json."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "a_file").write_text("not a directory\n")
    (root / "empty").mkdir()
    (root / "bad.yaml").write_text("stage: simpo\nsteps: [1,\n")
    (root / "list.yaml").write_text("- stage\n- simpo\n")
    (root / "rows.jsonl").write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n{broken\n")
    (root / "score_rows.jsonl").write_text(json.dumps({"prompt": "p", "response": "a"}) + "\n")
    (root / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9", "response": "a"}\n')
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    return root


def _argv(row, files, tmp_path):
    return [a.replace("FILES", str(files)).replace("TMP", str(tmp_path)) for a in row]


OUT = "--set=output_dir=TMP/run"
TABLE = [
    # (cli, argv, status, text the error must contain)
    ("train", ["--config", "FILES/missing.yaml"], 2, "missing.yaml"),
    ("train", ["--config", "FILES/bad.yaml"], 2, "bad.yaml"),
    ("train", ["--config", "FILES/list.yaml"], 2, "list.yaml"),
    ("train", [OUT, "--set", "no_such_key=1"], 2, "no_such_key"),
    ("train", [OUT, "--set", "steps=abc"], 2, "steps"),
    ("train", [OUT, "--set", "model.preset=tiny_qwen"], 2, "tiny_qwen"),
    ("train", [OUT, "--set", "model.compute_dtype=fp32"], 2, "compute_dtype"),
    ("train", [OUT, "--set", "model.overrides.num_layer=3"], 2, "num_layers"),
    ("train", [OUT, "--set", "model.overrides.num_layers=0"], 2, "num_layers"),
    ("train", [OUT, "--set", "stage=dpo"], 2, "stage"),
    ("train", [OUT, "--set", "data.source=FILES/missing.jsonl"], 2, "missing.jsonl"),
    ("train", [OUT, "--set", "data.seq_len 64"], 2, "key=value"),
    ("train", [OUT, "--topology", "v5p-8"], 2, "--compile-only"),
    ("train", [OUT, "--set", "data.batch_rows=0"], 2, "data.batch_rows"),
    ("train", [OUT, "--set", "optim.lr=-1"], 2, "optim.lr"),
    ("train", [OUT, "--set", "grad_accum=0"], 2, "grad_accum"),
    ("train", [OUT, "--set", "checkpoint.on_corrupt=skip"], 2, "checkpoint.on_corrupt"),
    ("train", [OUT, "--set", "data.seq_len=100000000", "--set", "steps=5"], 4, "do not fit"),
    ("train", [OUT, "--set", "memory_budget_gib=0.001", "--set", "steps=1"], 4, "does not fit"),
    ("train", ["--no-such-flag"], 2, "no-such-flag"),
    ("evaluate", ["--model-path", "FILES/missing", "--data-path", "FILES/empty"], 2, "--model-path"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/missing"], 2, "--data-path"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--max-new-tokens", "0"], 2,
     "--max-new-tokens"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--batch-size", "0"], 2,
     "--batch-size"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--max-length", "3"], 2,
     "--max-length"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--device-memory-gib", "0"], 2,
     "--device-memory-gib"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--mesh", "rows=2"], 2, "--mesh"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--replicas", "0"], 2,
     "--replicas"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--topology", "v5p-8"], 2,
     "--compile-only"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--chat-template",
                  "FILES/missing.jinja"], 2, "--chat-template"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--save-path", "FILES/a_file"], 2,
     "--save-path"),
    ("evaluate", ["--model-path", "FILES/empty", "--data-path", "FILES/empty", "--task-types", "Pairs"], 2,
     "--task-types"),
    ("evaluate", ["--model-path", "FILES/model", "--data-path", "FILES/empty"], 2, "config.json"),
    ("evaluate", ["--data-path", "FILES/empty"], 2, "--model-path"),
    ("export", ["--checkpoint", "FILES/missing", "--out", "TMP/out"], 2, "missing"),
    ("export", ["--checkpoint", "FILES/empty", "--out", "TMP/out"], 2, "empty"),
    ("export", ["--checkpoint", "FILES/model", "--out", "TMP/out"], 2, "config.json"),
    ("export", ["--checkpoint", "FILES/empty"], 2, "--out"),
    ("synthetic", ["--out", "TMP/data", "--num-train", "-3"], 2, "--num-train"),
    ("synthetic", ["--out", "TMP/data", "--lengths", "64,0"], 2, "--lengths"),
    ("synthetic", ["--out", "TMP/data", "--num-rejects", "3", "--num-values", "3"], 2, "--num-values"),
    ("synthetic", ["--out", "FILES/a_file"], 2, "a_file"),
    ("inspect", ["--data", "FILES/missing.jsonl", "--tokenizer", "FILES/empty"], 2, "missing.jsonl"),
    ("inspect", ["--data", "FILES/rows.jsonl"], 2, "--tokenizer"),
    ("launch", ["-n", "0", "train"], 2, "--nproc"),
    ("launch", ["-n", "2", "evaluate"], 2, "evaluate"),
    ("launch", ["-n", "2"], 2, "command"),
    ("score", ["--model-path", "FILES/missing", "--input", "FILES/rows.jsonl"], 2, "--model-path"),
    ("score", ["--model-path", "FILES/empty", "--input", "FILES/missing.jsonl"], 2, "--input"),
    ("score", ["--model-path", "FILES/empty", "--input", "FILES/rows.jsonl"], 2, "line 1, field 'response'"),
    ("score", ["--model-path", "FILES/empty", "--input", "FILES/score_rows.jsonl", "--output", "FILES/empty"], 2,
     "is a directory"),
    ("score", ["--model-path", "FILES/empty", "--input", "FILES/latin1.jsonl"], 2, "line 1 is not UTF-8"),
    ("train", [OUT, "--set", "steps=99999999999999999999999"], 2, "steps: 99999999999999999999999 is out of range"),
    ("export", ["--checkpoint", "FILES/empty", "--out", "TMP/out", "--max-shard-size", "0"], 2, "more than 0 bytes"),
    ("launch", ["-n", "1", "--port", "99999", "train"], 2, "--port must be in [1, 65535]"),
    ("score", ["--model-path", "FILES/empty", "--input", "FILES/a_file"], 2, "line 1: not valid JSON"),
    ("score", ["--model-path", "FILES/empty", "--input", "FILES/rows.jsonl", "--batch-size", "0"], 2,
     "--batch-size"),
    ("score", ["--model-path", "FILES/empty", "--input", "FILES/rows.jsonl", "--mesh", "rows=2"], 2, "--mesh"),
]


def _run(cli, argv):
    try:
        return CLIS[cli](argv)
    except SystemExit as stop:  # argparse's own refusals
        return stop.code


def test_the_table_is_large_and_covers_every_cli():
    assert len(TABLE) >= 40
    assert {row[0] for row in TABLE} == set(CLIS)


@pytest.mark.parametrize("cli, argv, status, text", TABLE, ids=[f"{r[0]}-{i}" for i, r in enumerate(TABLE)])
def test_exit_status(cli, argv, status, text, files, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LONGRM_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)  # the tiny default config's relative paths land here
    code = _run(cli, _argv(argv, files, tmp_path))
    err = capsys.readouterr().err
    assert code == status, f"exit {code}, expected {status}; stderr:\n{err[-2000:]}"
    assert "Traceback" not in err
    assert text in err, err[-2000:]


@pytest.mark.parametrize("cli", sorted(CLIS))
def test_help_exits_0(cli, capsys):
    assert _run(cli, ["--help"]) == 0
    assert "usage:" in capsys.readouterr().out
