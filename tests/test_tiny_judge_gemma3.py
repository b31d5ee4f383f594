"""The tiny judge recipe's DisRM half with another family (issue 43): what `FAMILY=gemma3 bash
scripts/tiny_judge.sh` runs, shortened to a few steps: Bradley-Terry on the tiny_gemma3 preset (a layer through a
64-token window shorter than the rows, then a global one), its HF export (a Gemma 3 text config and score
head), and `evaluate --is-disrm --both-orders` on two benchmark samples: the CLIs chain and write their outputs.
Few steps teach nothing; accuracy is not checked (docs/benchmarks.md has the full recipe's figures)."""

import json
import os

from longrm_jax import evaluate, export, train
from longrm_jax.data import synthetic
from longrm_jax.data.tiny_tokenizer import TINY_JUDGE_TOKENIZER_DIR

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")
SHORT = ["steps=2", "log_every=1", "progress=false", "tensorboard=false", "eval_before=false", "eval_after=false",
         "data.batch_rows=2", "data.seq_len=256", f"data.tokenizer={TINY_JUDGE_TOKENIZER_DIR}"]


def _train(config, out, data_file, eval_file, *extra):
    argv = ["--config", os.path.join(CONFIGS, config)]
    for item in SHORT + [f"output_dir={out}", f"data.source={data_file}", f"data.eval_source={eval_file}", *extra]:
        argv += ["--set", item]
    assert train.main(argv) == 0


def test_tiny_gemma3_disrm_trains_exports_and_evaluates(tmp_path):
    data = tmp_path / "data"
    synthetic.main(["--out", str(data), "--judge", "--lengths", "16", "--num-train", "8", "--num-eval", "4",
                    "--bench-per-task", "2", "--bench-bon-fraction", "0"])
    # (the script starts BT from the needle LM's export; CI starts it from the preset: one compile less)
    _train("tiny_disrm_bt.yaml", tmp_path / "bt", data / "disrm_train.jsonl", data / "disrm_eval.jsonl",
           "model.init=null", "model.preset=tiny_gemma3")
    assert export.main(["--checkpoint", str(tmp_path / "bt"), "--out", str(tmp_path / "disrm_hf")]) == 0
    hf = json.loads((tmp_path / "disrm_hf" / "config.json").read_text())
    assert hf["architectures"] == ["Gemma3TextForSequenceClassification"] and hf["sliding_window"] == 64
    assert set(hf["layer_types"]) == {"sliding_attention", "full_attention"}
    assert evaluate.main(["--model-path", str(tmp_path / "disrm_hf"), "--data-path", str(data / "long_rewardbench"),
                          "--tasks", "LongQA", "--save-path", str(tmp_path / "eval"), "--is-disrm", "--both-orders",
                          "--dtype", "float32", "--no-progress"]) == 0
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["both_orders"]["samples"] == 2 and results["results"]["LongQA"] is not None
