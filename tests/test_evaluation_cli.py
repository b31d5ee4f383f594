"""End-to-end `python -m longrm_jax.evaluate` on synthetic task files with tiny random checkpoints."""

import csv
import dataclasses
import json
import shutil

import numpy as np
import pytest

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips

from longrm_jax import evaluate
from longrm_jax.cli_support import InputError  # noqa: E402
from longrm_jax.data.synthetic import write_long_rewardbench  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint, make_tiny_model_dir  # noqa: E402

TASKS = ("LongQA", "Code")


def _checkpoint(path, family, head, tokenizer=True, seed=0):
    if tokenizer:
        make_tiny_model_dir(path, family, head, layers=1, seed=seed)
    else:
        make_tiny_checkpoint(path, family, head=head, vocab_size=650, pad_token_id=0, kv_heads=2, layers=1, seed=seed)
    return str(path)


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    write_long_rewardbench(str(out), per_task=4, seed=0, lengths=(48, 96), tasks=TASKS, bon_fraction=0.5)
    return out


def _read_outputs(save):
    with open(save / "results.csv") as handle:
        rows = list(csv.reader(handle))
    predictions = [json.loads(line) for line in (save / "predictions.jsonl").read_text().splitlines()]
    return rows, json.loads((save / "results.json").read_text()), predictions


def test_help_documents_flags(capsys):
    with pytest.raises(SystemExit):
        evaluate.main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--model-path", "--data-path", "--is-disrm", "--save-path", "--tasks", "--max-new-tokens",
                 "--both-orders", "--batch-size", "--mesh", "--max-length", "--no-truncate", "--seed",
                 "--no-gpu-flags"):
        assert flag in text


def test_gpu_decode_flags_only_for_grm_on_gpu(monkeypatch):
    """GRM runs on a GPU get the decode XLA flags; DisRM, --no-gpu-flags, CPU-only and late calls do not."""
    from jax._src import xla_bridge

    from longrm_jax.xla_flags import GPU_DECODE_XLA_FLAGS

    def args(*extra):
        return evaluate.read_config(["--model-path", "m", "--data-path", "d", *extra])

    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
    monkeypatch.setattr(evaluate, "_gpu_backend_possible", lambda environ: True)
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert evaluate.apply_gpu_decode_flags(args(), env)
    assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=8", *GPU_DECODE_XLA_FLAGS]
    for extra in (["--is-disrm"], ["--no-gpu-flags"]):
        env = {}
        assert not evaluate.apply_gpu_decode_flags(args(*extra), env) and env == {}
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: True)  # too late to take effect
    env = {}
    assert not evaluate.apply_gpu_decode_flags(args(), env) and env == {}
    monkeypatch.undo()
    assert not evaluate._gpu_backend_possible({"JAX_PLATFORMS": "cpu"})
    env = {"JAX_PLATFORMS": "cpu"}
    assert not evaluate.apply_gpu_decode_flags(args(), env) and "XLA_FLAGS" not in env


def test_disrm_end_to_end(tmp_path, bench_dir):
    model = _checkpoint(tmp_path / "rm", "llama", "classifier")
    save = tmp_path / "out"
    assert evaluate.main(["--model-path", model, "--data-path", str(bench_dir), "--is-disrm", "--save-path",
                          str(save), "--dtype", "float32", "--both-orders", "--no-progress"]) == 0
    rows, results, predictions = _read_outputs(save)
    assert rows[0] == ["", "Task", "Value"]
    assert [r[1] for r in rows[1:]] == ["LongQA", "Code", "Same.", "Diff.", "PairWise Avg.", "Rank2", "Rank3",
                                        "Rank4", "Rank Avg.", "4k", "8k", "16k", "32k", "64k", "128k", "AVG."]
    assert len(predictions) == 8
    for p in predictions:
        assert len(p["scores"]) == len(p["shown_order"]) == (2 if p["tasktype"] == "PairWise" else int(p["subtype"]))
        assert {"id", "task", "tasktype", "subtype", "length", "correct"} <= set(p)
        assert len(p["orders"]) == len(p["shown_order"])
    assert results["both_orders"]["samples"] == 8
    upstream = [json.loads(line) for line in (save / "Code.jsonl").read_text().splitlines()]
    assert len(upstream) == 4 and {"output", "shuffled_order", "tasktype", "subtype", "ctx_length"} <= set(upstream[0])
    assert len(upstream[0]["output"]) == len(upstream[0]["shuffled_order"])
    assert 0.0 <= results["auc"]["overall"] <= 1.0
    assert (save / "accuracy_by_length.png").exists()
    shared = tmp_path / "shared"
    assert evaluate.main(["--model-path", model, "--data-path", str(bench_dir), "--is-disrm", "--save-path",
                          str(shared), "--dtype", "float32", "--share-prompt", "--no-progress", "--tasks", "Code",
                          "--limit", "2"]) == 0
    whole = {p["id"]: p["scores"] for p in predictions}
    _, _, shared_predictions = _read_outputs(shared)
    assert len(shared_predictions) == 2
    for split in shared_predictions:
        np.testing.assert_allclose(split["scores"], whole[split["id"]], rtol=1e-4, atol=1e-6)


def test_grm_end_to_end(tmp_path, bench_dir):
    model = _checkpoint(tmp_path / "grm", "qwen3", "causal_lm")
    save = tmp_path / "out"
    assert evaluate.main(["--model-path", model, "--data-path", str(bench_dir), "--tasks", "Code",
                          "--save-path", str(save), "--dtype", "float32", "--max-new-tokens", "8",
                          "--no-progress", "--batch-size", "2", "--both-orders"]) == evaluate.NO_VERDICT_EXIT
    # (a random judge writes no verdict: exit status 3, its outputs written all the same)
    rows, results, predictions = _read_outputs(save)
    assert [r[1] for r in rows[1:3]] == ["Code", "Same."]
    assert len(predictions) == 4
    for p in predictions:
        assert isinstance(p["output"], str) and p["generated_tokens"] <= 8
        assert p["correct"] is False or p["verdict"] is not None
        assert [o["shown_order"] for o in p["orders"]][0] == p["shown_order"]
        assert len(p["orders"]) == len(p["shown_order"])  # swapped pair / every rotation
    assert results["both_orders"]["samples"] == 4
    assert results["settings"]["model_type"] == "Generative RM"


def test_grm_without_verdicts_is_reported_loudly(tmp_path, bench_dir, capsys, caplog):
    """A random judge never writes a verdict: every score is 0 and the AUC 0.5. That used to pass silently;
    now the count and share are in results.json and the console, with a warning, and the exit status is 3 (a
    pipeline must not take it for success); the outputs are written all the same."""
    model = _checkpoint(tmp_path / "grm", "qwen3", "causal_lm")
    save = tmp_path / "out"
    assert evaluate.main(["--model-path", model, "--data-path", str(bench_dir), "--tasks", "Code",
                          "--save-path", str(save), "--dtype", "float32", "--max-new-tokens", "4",
                          "--no-progress"]) == 3
    captured = capsys.readouterr()
    assert "error: none of the 4 judgements held a parsable verdict (exit status 3)" in captured.err
    rows, results, predictions = _read_outputs(save)
    assert all(p["verdict"] is None for p in predictions)
    assert results["unparsable_verdicts"] == {"unparsable": 4, "judgements": 4, "share": 1.0}
    assert "unparsable_verdicts  4 of 4 (100.0%)" in captured.out.splitlines()  # the results.json key
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith("4 of 4 judgements (100.0%) held no parsable verdict") for w in warnings), warnings
    # Groups without samples (only Code's pairwise rows exist here) print empty, never 0.00000.
    by_label = {r[1]: r[2] for r in rows[1:]}
    assert by_label["LongQA"] == "" if "LongQA" in by_label else True
    assert by_label["128k"] == "" and by_label["64k"] == ""
    assert "128k" in captured.out and all(not line.startswith("128k") or line.strip() == "128k"
                                   for line in captured.out.splitlines())


def test_cli_errors_name_the_file(tmp_path, bench_dir, capsys):
    model = _checkpoint(tmp_path / "notok", "llama", "classifier", tokenizer=False)
    assert evaluate.main(["--model-path", model, "--data-path", str(bench_dir), "--is-disrm",
                          "--save-path", str(tmp_path / "o")]) == 2
    assert f"{model}: no tokenizer" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "Math.jsonl").write_text("")
    good_model = _checkpoint(tmp_path / "rm", "llama", "classifier")
    assert evaluate.main(["--model-path", good_model, "--data-path", str(bad), "--is-disrm"]) == 2
    assert "Math.jsonl: the task file is empty" in capsys.readouterr().err
    assert evaluate.main(["--model-path", good_model, "--data-path", str(bench_dir), "--save-path",
                          str(bench_dir)]) == 2
    assert "--save-path must differ" in capsys.readouterr().err


def test_long_form_disrm_with_needle_heatmap(tmp_path):
    model = _checkpoint(tmp_path / "rm", "llama", "classifier")
    data = tmp_path / "longform"
    data.mkdir()
    records = [dict(id=f"n{i}", prompt=f"Write about topic {i}.", chosen=[f"A careful answer {i}."],
                    rejected=[f"A wrong answer {i}.", f"Another one {i}.", "Meh."] if i % 2 else ["Bad."],
                    subset="Writing" if i % 2 else "Reasoning", needle_position=i / 11,
                    length_bucket=("1K", "2K")[i % 2]) for i in range(12)]
    (data / "needle.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    save = tmp_path / "out"
    assert evaluate.main(["--model-path", model, "--data-path", str(data), "--is-disrm", "--save-path", str(save),
                          "--dtype", "float32", "--no-progress"]) == 0
    rows, results, predictions = _read_outputs(save)
    assert [r[1] for r in rows[1:]] == ["Reasoning", "Reasoning Binary", "Writing", "Writing Binary", "AVG.",
                                        "AVG. Binary"]
    assert all(p["benchmark"] == "long-form" and isinstance(p["correct"], bool) for p in predictions)
    for p in predictions:
        chosen, rejected = p["scores"][0], p["scores"][1:]
        assert p["correct"] == (chosen > max(rejected))
    heat = results["needle_heatmap"]
    assert heat["length_buckets"] == ["1K", "2K"] and sum(map(sum, heat["counts"])) == 12
    assert (save / "needle_heatmap.png").exists()


def test_parse_mesh():
    from longrm_jax.evaluation.config import parse_mesh

    assert parse_mesh("fsdp=2,seq=4") == {"fsdp": 2, "seq": 4}
    assert evaluate.read_config(["--model-path", "m", "--data-path", "d"]).mesh is None
    with pytest.raises(ValueError, match="AXIS=SIZE"):
        parse_mesh("pipeline=2")
    with pytest.raises(InputError, match="^--mesh 'pipeline=2': bad entry"):
        evaluate.read_config(["--model-path", "m", "--data-path", "d", "--mesh", "pipeline=2"])


def test_resume_reuses_finished_task_files(tmp_path, bench_dir, monkeypatch):
    from longrm_jax.evaluation import runner

    model = _checkpoint(tmp_path / "rm", "llama", "classifier")
    save = tmp_path / "out"
    args = ["--model-path", model, "--data-path", str(bench_dir), "--is-disrm", "--save-path", str(save),
            "--dtype", "float32", "--no-progress", "--limit", "2"]
    assert evaluate.main(args) == 0
    first = (save / "predictions.jsonl").read_text()
    assert sorted(p.name for p in (save / "partial").iterdir()) == ["Code.jsonl", "LongQA.jsonl"]

    def no_model(*_, **__):
        raise AssertionError("the model must not be loaded when every task file is reused")

    monkeypatch.setattr(runner, "load_model", no_model)
    assert evaluate.main(args + ["--resume"]) == 0
    assert (save / "predictions.jsonl").read_text() == first
    with pytest.raises(AssertionError, match="must not be loaded"):  # other settings: recomputed
        evaluate.main(args + ["--resume", "--seed", "7", "--debug"])


def test_resume_recomputes_after_the_weights_changed(tmp_path, bench_dir, monkeypatch, capsys):
    """Partial results are keyed by the model's content: re-exporting other weights into the same directory
    must not reuse the old predictions (it used to: they were keyed by the path)."""
    model = tmp_path / "rm"
    _checkpoint(model, "llama", "classifier")
    save = tmp_path / "out"
    args = ["--model-path", str(model), "--data-path", str(bench_dir), "--is-disrm", "--save-path", str(save),
            "--dtype", "float32", "--no-progress", "--limit", "2", "--tasks", "Code"]
    assert evaluate.main(args) == 0
    first = [p["scores"] for p in _read_outputs(save)[2]]
    # Same path, same config and shapes, other weights (a later export of another training step).
    shutil.rmtree(model)
    _checkpoint(model, "llama", "classifier", seed=123)
    assert evaluate.main(args + ["--resume"]) == 0
    again = [p["scores"] for p in _read_outputs(save)[2]]
    assert again != first
    fresh = tmp_path / "fresh"
    assert evaluate.main([a if a != str(save) else str(fresh) for a in args]) == 0
    assert again == [p["scores"] for p in _read_outputs(fresh)[2]]


def test_is_disrm_on_a_causal_lm_suggests_dropping_the_flag(tmp_path, bench_dir, capsys):
    model = _checkpoint(tmp_path / "lm", "qwen3", "causal_lm")
    classifier = _checkpoint(tmp_path / "rm", "llama", "classifier")
    capsys.readouterr()
    assert evaluate.main(["--model-path", model, "--data-path", str(bench_dir), "--is-disrm",
                          "--save-path", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"error: {model}: a causal LM (Qwen3ForCausalLM) has no trained score head "
                                       "for --is-disrm; drop --is-disrm to evaluate it as a generative judge\n")
    assert evaluate.main(["--model-path", classifier, "--data-path", str(bench_dir),
                          "--save-path", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"error: {classifier}: a sequence classifier (LlamaForSequenceClassification) "
                                       "cannot generate verdicts; pass --is-disrm to score answers with its reward "
                                       "head\n")


def test_training_checkpoint_as_model_path_says_export_it(tmp_path, bench_dir, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "5" / "state").mkdir(parents=True)
    assert evaluate.main(["--model-path", str(run), "--data-path", str(bench_dir), "--is-disrm"]) == 2
    assert capsys.readouterr().err == (f"error: {run}: a training checkpoint (orbax), not a Hugging Face directory; "
                                       f"convert it first: python -m longrm_jax.export --checkpoint {run} --out DIR\n")


def test_unroll_decode_layers_by_run_size():
    """auto unrolls a decode step's layer loop only when the run's token budget pays for the extra compiles."""
    from longrm_jax.evaluation.runner import UNROLL_MIN_DECODE_TOKENS, EvalConfig, unroll_decode_layers

    cfg = EvalConfig(model_path="m", data_path="d", max_new_tokens=2048)
    assert unroll_decode_layers(cfg, samples=-(-UNROLL_MIN_DECODE_TOKENS // 2048))  # the full benchmark
    assert not unroll_decode_layers(dataclasses.replace(cfg, max_new_tokens=256), samples=35)  # a small slice
    assert unroll_decode_layers(dataclasses.replace(cfg, unroll_decode_layers="on"), samples=1)
    assert not unroll_decode_layers(dataclasses.replace(cfg, unroll_decode_layers="off"), samples=10**6)
    with pytest.raises(ValueError, match="auto, on or off"):
        unroll_decode_layers(dataclasses.replace(cfg, unroll_decode_layers="yes"), samples=1)


def test_save_path_with_results_is_refused_without_overwrite(tmp_path, bench_dir, monkeypatch, capsys):
    """An evaluation into a save path holding an earlier one's results used to overwrite them silently."""
    from longrm_jax.evaluation import runner

    model = _checkpoint(tmp_path / "rm", "llama", "classifier")
    save = tmp_path / "out"
    args = ["--model-path", model, "--data-path", str(bench_dir), "--is-disrm", "--save-path", str(save),
            "--dtype", "float32", "--no-progress", "--limit", "1", "--tasks", "Code"]
    assert evaluate.main(args) == 0
    before = {p.name: p.read_bytes() for p in save.iterdir() if p.is_file()}
    capsys.readouterr()
    real_load = runner.load_model
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("refused before loading the model"))
    assert evaluate.main(args + ["--seed", "7"]) == 2
    assert capsys.readouterr().err == (
        f"error: {save}: --save-path already holds the results of an earlier evaluation (results.json, results.csv, "
        "predictions.jsonl, timings.json, partial): pass --resume to reuse its finished task files, --overwrite to "
        "replace them, or another --save-path\n")
    assert {p.name: p.read_bytes() for p in save.iterdir() if p.is_file()} == before
    monkeypatch.setattr(runner, "load_model", real_load)
    assert evaluate.main(args + ["--seed", "7", "--overwrite"]) == 0
    assert json.loads((save / "results.json").read_text())["settings"]["seed"] == 7
