"""scripts/bench_train.py and scripts/bench_optimizer.py run end to end on the CPU (--smoke): both layouts,
the step's parts, the JSON rows, the plot and the longest-pair lines."""

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
                   "--devices", "1", "--no-torch", "--layout", layout, "--breakdown", "--steps", "2",
                   "--json", str(out), "--plot", str(png)])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["layout"] == layout and row["tokens_per_s"] > 0 and len(row["step_times"]) == 2, row
    assert row["part_grad_s"] > 0 and row["part_split_step_s"] > 0
    assert png.stat().st_size > 10_000
    assert "Longest pair trained: Qwen3-8B bt jax 1dev: 2 x 64 tokens" in stdout


def test_bench_optimizer_smoke():
    stdout = _run([os.path.join("scripts", "bench_optimizer.py"), "--smoke", "--steps", "1"])
    assert "| clip + adamw + finite guard (train step) |" in stdout
