"""The trainer compiles its step before loading weights and stops, before any step, when the predicted device
memory exceeds the budget; model.remat auto takes the fastest policy that fits (training.memory_plan)."""

import json
import os

import pytest

from longrm_jax.training import loop
from longrm_jax.training.config import load_config
from longrm_jax.training.memory_plan import MemoryPlanError

# 4 layers, 4 rows of 512 tokens: on the CPU the gradient program needs ~131 MiB without remat, ~76 MiB with.
TINY = ["stage=simpo", "data.seq_len=512", "data.batch_rows=4", "model.overrides={num_layers: 4}",
        "data.synthetic.lengths=[100,200]", "data.num_train=16", "data.num_eval=8", "steps=2", "log_every=1",
        "tensorboard=false", "progress=false", "checkpoint.every=0", "mesh.fsdp=1"]


def test_step_that_does_not_fit_stops_before_any_step(tmp_path):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "memory_budget_gib=0.05", "model.remat=full"])
    with pytest.raises(MemoryPlanError) as err:
        loop.run(cfg)
    msg = str(err.value)
    assert msg.startswith("the train step does not fit the device: predicted 0.07 GiB per device, available 0.05 GiB "
                          "(model.remat=full; compiled program analysis):")
    assert "gradients: train state" in msg and "model.remat=full (or auto" in msg and "mesh.seq > 1" in msg
    assert "lora.rank > 0" in msg and "model.param_dtype=bfloat16" in msg
    assert not os.path.exists(tmp_path / "metrics.jsonl") and not os.path.exists(tmp_path / "checkpoints")


def test_remat_auto_takes_the_fastest_policy_that_fits(tmp_path, caplog):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "memory_budget_gib=0.1", "model.remat=auto"])
    result = loop.run(cfg)
    assert result.final_step == 2
    plan = json.loads((tmp_path / "memory_plan.json").read_text())
    assert plan["remat"] == "save_attention_out" and plan["tried"][0].startswith("none ")
    assert plan["predicted_peak_gib"] <= 0.1
    # The train state (with the optimizer moments, which the gradient program never reads) counts in every program.
    grads, update = plan["programs"]
    assert grads["resident"] == update["resident"] > 0 and update["inputs"] > 0
    assert "remat: save_attention_out" in (tmp_path / "config.yaml").read_text()
