"""Evaluate flags checked before anything loads (issue 29 items 5-8): negative or zero counts, paths that are
files, the DisRM dtype taken from the checkpoint, truncation and both-orders agreement on the console."""

import json

import pytest

pytest.importorskip("torch")

from longrm_jax import evaluate  # noqa: E402
from longrm_jax.data.synthetic import write_long_rewardbench  # noqa: E402
from longrm_jax.evaluation import runner  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    write_long_rewardbench(str(out), per_task=3, seed=0, lengths=(48, 96), tasks=("Code",), bon_fraction=0.0)
    return out


@pytest.fixture(scope="module")
def disrm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    make_tiny_model_dir(path, "llama", "classifier", layers=1)
    return path


@pytest.mark.parametrize("flags, message", [
    (["--limit", "-1"], "--limit must be >= 1; got -1"),  # item 5: used to drop each task's last sample
    (["--limit", "0"], "--limit must be >= 1; got 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1; got 0"),
    (["--batch-size", "-3"], "--batch-size must be >= 1; got -3"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1; got 0"),
    (["--max-batch-tokens", "0"], "--max-batch-tokens must be >= 1; got 0"),
    (["--decode-chunk", "0"], "--decode-chunk must be >= 1; got 0"),
    (["--max-length", "10"], "--max-length must be >= 16; got 10"),
    (["--device-memory-gib", "0"], "--device-memory-gib must be > 0; got 0.0"),
    (["--mesh", "fsdp=0"], "--mesh fsdp=0: sizes must be >= 1 (fsdp=-1: the devices left over)"),
    (["--chat-template", "/nonexistent.jinja"], "--chat-template /nonexistent.jinja: no such file"),
])
def test_bad_values_are_refused_before_anything_loads(flags, message, bench_dir, disrm_dir, monkeypatch, capsys):
    monkeypatch.setattr(evaluate, "apply_gpu_decode_flags", lambda args: pytest.fail("got past the checks"))
    argv = ["--model-path", str(disrm_dir), "--data-path", str(bench_dir), "--is-disrm", *flags]
    assert evaluate.main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_paths_are_checked_before_anything_loads(tmp_path, bench_dir, disrm_dir, monkeypatch, capsys):
    monkeypatch.setattr(evaluate, "apply_gpu_decode_flags", lambda args: pytest.fail("got past the checks"))
    a_file = tmp_path / "results.txt"
    a_file.write_text("mine")
    base = ["--model-path", str(disrm_dir), "--data-path", str(bench_dir), "--is-disrm"]
    cases = [
        (["--save-path", str(a_file)], f"--save-path {a_file} is a file; a directory is needed"),
        (["--save-path", str(a_file / "sub")], f"--save-path {a_file / 'sub'} is under {a_file}, which is a file; "
                                               "a directory is needed"),
        (["--compilation-cache", str(a_file)], f"--compilation-cache {a_file} is a file; a directory is needed"),
    ]
    for flags, message in cases:
        assert evaluate.main([*base, *flags]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"
    assert a_file.read_text() == "mine"
    assert evaluate.main(["--model-path", str(tmp_path / "none"), "--data-path", str(bench_dir)]) == 2
    assert capsys.readouterr().err == (f"error: --model-path {tmp_path / 'none'}: not a directory (a local Hugging "
                                       "Face checkpoint directory is needed)\n")
    assert evaluate.main(["--model-path", str(disrm_dir), "--data-path", str(tmp_path / "nodata")]) == 2
    assert capsys.readouterr().err == f"error: --data-path {tmp_path / 'nodata'} does not exist\n"


def test_limit_keeps_exactly_n_samples_per_task(bench_dir):
    """Item 5: a limit is a count (``samples[:-1]`` used to drop the last sample of every task)."""
    everything = runner.load_samples(runner.EvalConfig(model_path="m", data_path=str(bench_dir)))
    assert len(everything) == 3
    for limit in (1, 3, 5):
        cfg = runner.EvalConfig(model_path="m", data_path=str(bench_dir), limit=limit)
        assert [s.id for s in runner.load_samples(cfg)] == [s.id for s in everything[:limit]]


def test_disrm_defaults_to_the_checkpoint_dtype(disrm_dir, tmp_path):
    """Item 8: an fp32 checkpoint is scored in fp32 (bfloat16 turned close scores into ties and flips);
    a bf16 / fp16 checkpoint in its own dtype; a GRM keeps bfloat16; an explicit --dtype wins."""
    cfg = runner.EvalConfig(model_path=str(disrm_dir), data_path="d", is_disrm=True)
    assert json.loads((disrm_dir / "config.json").read_text()).get("dtype", "float32") == "float32"
    assert runner.resolve_dtype(cfg) == "float32"
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_text(json.dumps({"torch_dtype": "float16", "architectures": ["X"]}))
    assert runner.resolve_dtype(runner.EvalConfig(model_path=str(half), data_path="d", is_disrm=True)) == "float16"
    assert runner.resolve_dtype(runner.EvalConfig(model_path=str(half), data_path="d")) == "bfloat16"
    assert runner.resolve_dtype(runner.EvalConfig(model_path=str(half), data_path="d", is_disrm=True,
                                                  dtype="bfloat16")) == "bfloat16"
    assert evaluate.build_parser().parse_args(["--model-path", "m", "--data-path", "d"]).dtype == "auto"
    assert "float16" in evaluate.build_parser().format_help()


def test_console_shows_truncation_agreement_and_dtype(disrm_dir, bench_dir, tmp_path, capsys):
    """Items 6 and 8: --max-length cuts show on the console per task, --both-orders agreement is printed, and
    the default dtype of a DisRM run is the checkpoint's (results.json settings)."""
    save = tmp_path / "out"
    assert evaluate.main(["--model-path", str(disrm_dir), "--data-path", str(bench_dir), "--is-disrm",
                          "--save-path", str(save), "--both-orders", "--max-length", "16", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    results = json.loads((save / "results.json").read_text())
    assert results["settings"]["dtype"] == "float32"
    assert results["truncated_by_task"] == {"Code": [3, 3]}
    assert ("truncated: 3 of 3 samples longer than --max-length 16 were judged on their first and last tokens only "
            "(Code 3 of 3); --no-truncate or a larger --max-length judges them whole") in out
    agreement = results["both_orders"]
    # The headline figures (issue 42 item 7): the console's label is the results.json key, same value
    line = [row for row in out if row.startswith("both_orders_agreement ")]
    assert line and line[0].split()[1:4] == [f"{results['both_orders_agreement']:.5f}", "of", "3"], out
    assert results["both_orders_agreement"] == agreement["agreement"]  # the older key kept
    accuracy = [row for row in out if row.startswith("both_orders_accuracy ")]  # the README's headline figure
    assert accuracy and accuracy[0].split()[1] == f"{results['both_orders_accuracy']:.5f}", out
    assert results["both_orders_accuracy"] == agreement["mean_accuracy_all_orders"]
    assert results["accuracy_by_length_both_orders"]["All"] and "accuracy_by_length" in results
