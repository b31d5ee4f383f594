"""Held-out judging while a generative judge trains (``judge.*``, longrm_jax.held_out_judge): the figures a run
logs for a judged step are the evaluator's on that step's export, prompt for prompt and verdict for verdict, and
the settings that cannot work are refused before anything runs."""

import json

import pytest

from longrm_jax import evaluate, export, train
from longrm_jax.data import synthetic
from longrm_jax.data.tiny_tokenizer import TINY_JUDGE_TOKENIZER_DIR
from longrm_jax.training.config import ConfigError, load_config


@pytest.mark.parametrize("sets, message", [
    (["stage=bt", "judge.data=bench"], "held-out judging is for generative judges"),
    (["stage=sft", "judge.data=bench", "checkpoint.at_end=false"], "needs checkpoint.at_end: true"),
    (["stage=sft", "judge.data=bench", "checkpoint.every=10", "judge.every=15"], "must be a multiple of"),
    (["stage=sft", "judge.data=bench", "judge.every=10"], "must be a multiple of"),
    (["stage=sft", "judge.data=bench", "judge.samples=0"], "judge.samples"),
])
def test_judge_settings_that_cannot_work_are_refused(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets)


def _records(path):
    return [json.loads(line) for line in open(path)]


def test_training_verdicts_equal_evaluate_on_the_export(tmp_path, capsys):
    """SFT from random weights (near chance: the point is equality, and that chance shows as chance): the run
    judges steps 2 and 4; evaluate --both-orders --limit 2 on the exported step 4 gives the same predictions."""
    data = tmp_path / "data"
    assert synthetic.main(["--out", str(data), "--judge", "--lengths", "32", "--num-train", "64", "--num-eval", "8",
                           "--bench-per-task", "3", "--bench-bon-fraction", "0"]) == 0
    bench = data / "long_rewardbench" / "LongQA.jsonl"
    sets = ["stage=sft", "model.preset=tiny_qwen3", "model.overrides={num_layers: 1}", f"output_dir={tmp_path / 'run'}",
            f"data.source={data / 'judge_sft_train.jsonl'}", f"data.eval_source={data / 'judge_eval.jsonl'}",
            f"data.tokenizer={TINY_JUDGE_TOKENIZER_DIR}", "data.seq_len=512", "data.batch_rows=2", "steps=4",
            "checkpoint.every=2", "progress=false", "tensorboard=false", "mesh.data=1", "mesh.fsdp=1",
            f"judge.data={bench}", "judge.samples=2", "judge.every=2", "judge.max_new_tokens=16"]
    assert train.main([a for s in sets for a in ("--set", s)]) == 0
    out = capsys.readouterr().out
    judged = [r for r in _records(tmp_path / "run" / "metrics.jsonl") if r["split"] == "judge"]
    assert [r["step"] for r in judged] == [2, 4]
    assert all(r["judgements"] == 4 for r in judged)  # 2 samples x both orders
    held_out = [r for r in _records(tmp_path / "run" / "metrics.jsonl") if r["split"] == "eval"]
    assert held_out and all("judgement_logprob_accuracy" in r and "accuracy" not in r for r in held_out)
    assert "judge at step 4: held-out verdict accuracy" in out and "judgement log-prob accuracy on held-out" in out

    assert export.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    code = evaluate.main(["--model-path", str(tmp_path / "hf"), "--data-path", str(bench), "--save-path",
                          str(tmp_path / "eval"), "--both-orders", "--limit", "2", "--max-new-tokens", "16",
                          "--dtype", "float32", "--no-progress", "--allow-no-verdicts"])
    assert code == 0
    want = _records(tmp_path / "eval" / "predictions.jsonl")
    got = _records(tmp_path / "run" / "judge" / "step_4" / "results" / "predictions.jsonl")
    assert got == want
    summary = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert judged[-1]["verdict_accuracy"] == summary["both_orders_accuracy"]
    assert judged[-1]["unparsable"] == summary["unparsable_verdicts"]["unparsable"]
    assert not (tmp_path / "run" / "judge" / "step_4" / "export").exists()  # the judged export is removed
