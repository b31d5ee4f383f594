"""A shorter version of the default run (`python -m longrm_jax.train`, in a subprocess at the execution-heavy
compile level: tests/helpers/execution_heavy.py): held-out pairwise accuracy rises well above chance, and metrics
land in metrics.jsonl."""

import json

import pytest

from helpers.execution_heavy import train_cli


@pytest.mark.slow
def test_short_default_run_learns(tmp_path):
    sets = [f"output_dir={tmp_path}", "steps=60", "data.batch_rows=8", "data.synthetic.lengths=[8,16]",
            "data.synthetic.num_values=4", "data.num_train=512", "data.num_eval=64", "checkpoint.every=0",
            "tensorboard=false", "progress=false", "log_every=20"]
    train_cli([a for s in sets for a in ("--set", s)])  # the default config (configs/tiny_default.yaml)
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [(l["step"], l["accuracy"]) for l in lines if l["split"] == "eval"]
    (before_step, accuracy_before), (final_step, accuracy_after) = evals  # before the first step, after the last
    assert before_step == 0 and final_step == 60
    assert accuracy_before < 0.65
    assert accuracy_after >= 0.7 and accuracy_after - accuracy_before >= 0.2, evals
    train = [l for l in lines if l["split"] == "train"]
    assert [l["step"] for l in train] == [20, 40, 60]
    for key in ("loss", "chosen_reward", "rejected_reward", "accuracy", "margin", "lr", "grad_norm", "tokens_per_s",
                "mfu"):
        assert key in train[-1]
    assert train[-1]["loss"] < train[0]["loss"]
