"""scripts/bench_train.py and scripts/bench_optimizer.py run end to end on the CPU (--smoke): both layouts
through the training CLI, the JSON rows, the plot and the longest-pair lines."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, timeout=600):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # the script sets its own fake device count
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["rows", "packed"])
def test_bench_train_smoke(tmp_path, layout):
    out, png = tmp_path / "rows.jsonl", tmp_path / "scaling.png"
    stdout = _run([os.path.join("scripts", "bench_train.py"), "--smoke", "--models", "qwen3_8b", "--stages", "bt",
                   "--devices", "1", "--no-torch", "--layout", layout, "--steps", "2", "--warmup", "1",
                   "--json", str(out), "--plot", str(png)])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["layout"] == layout and row["tokens_per_s"] > 0 and len(row["step_times"]) == 2, row
    # The JAX figures are the training CLI's own: its command line and its memory plan.
    assert " -m longrm_jax.train --config " in row["command"] and "configs/llama31_8b_disrm_bt.yaml" in row["command"]
    assert row["remat_used"] == "none" and row["predicted_gib"] > 0
    assert png.stat().st_size > 10_000
    assert "Longest pair trained: Qwen3-8B bt jax 1dev: 2 x 128 tokens" in stdout


def test_bench_optimizer_smoke():
    stdout = _run([os.path.join("scripts", "bench_optimizer.py"), "--smoke", "--iters", "1"])
    assert "| clip + adamw + finite guard (train step) |" in stdout
