"""The tiny judge recipe of README "A judge from scratch", shortened to a few steps: the shipped configs chained
through the CLIs as scripts/tiny_judge.sh chains them (needle LM; GRM SFT from it -> SimPO from its checkpoint ->
export -> evaluate --both-orders) on freshly generated synthetic files. The recipe's DisRM half (the LM's export ->
BT from it -> export -> evaluate --is-disrm --both-orders) runs in tests/test_tiny_judges_learn.py, long enough
to check that it learns.

It checks that the recipe runs and that its pieces fit (paths, stage 2 from stage 1, judge tokenizer in the
export, both orders judged, verdicts counted); a few steps teach nothing, so it does not check accuracy."""

import json
import os

import pytest

from longrm_jax import evaluate, export, train
from longrm_jax.data import synthetic
from longrm_jax.data.tiny_tokenizer import TINY_JUDGE_TOKENIZER_DIR

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")
SHORT = ["steps=2", "log_every=1", "progress=false", "tensorboard=false", "eval_before=false", "eval_after=false",
         "data.batch_rows=2", f"data.tokenizer={TINY_JUDGE_TOKENIZER_DIR}"]


def _train(config, out, data_file, eval_file, *extra):
    sets = SHORT + [f"output_dir={out}", f"data.source={data_file}", f"data.eval_source={eval_file}", *extra]
    argv = ["--config", os.path.join(CONFIGS, config)]
    for item in sets:
        argv += ["--set", item]
    assert train.main(argv) == 0


@pytest.mark.slow
def test_tiny_judge_recipe_runs_end_to_end(tmp_path):
    data = tmp_path / "data"
    synthetic.main(["--out", str(data), "--judge", "--lengths", "16", "--num-train", "8", "--num-eval", "4",
                    "--bench-per-task", "2", "--bench-bon-fraction", "0"])
    bench = data / "long_rewardbench"

    _train("tiny_lm_needle.yaml", tmp_path / "lm", data / "sft_train.jsonl", data / "eval.jsonl")
    _train("tiny_grm_sft.yaml", tmp_path / "sft", data / "judge_sft_train.jsonl", data / "judge_eval.jsonl",
           f"model.init={tmp_path / 'lm' / 'checkpoints'}")
    _train("tiny_grm_simpo.yaml", tmp_path / "simpo", data / "judge_train.jsonl", data / "judge_eval.jsonl",
           f"model.init={tmp_path / 'sft' / 'checkpoints'}")
    assert export.main(["--checkpoint", str(tmp_path / "simpo"), "--out", str(tmp_path / "grm_hf")]) == 0
    assert os.path.isfile(tmp_path / "grm_hf" / "tokenizer.json")
    assert evaluate.main(["--model-path", str(tmp_path / "grm_hf"), "--data-path", str(bench), "--tasks", "LongQA",
                          "--save-path", str(tmp_path / "grm_eval"), "--both-orders", "--dtype", "float32",
                          "--max-new-tokens", "4", "--no-progress"]) in (0, evaluate.NO_VERDICT_EXIT)
    # (a judge of 2 steps may write no verdict in 4 tokens: exit 3, the outputs written all the same)
    results = json.loads((tmp_path / "grm_eval" / "results.json").read_text())
    assert results["both_orders"]["samples"] == 2
    assert "unparsable_verdicts" in json.dumps(results)
