"""scripts/bench_train.py and scripts/bench_optimizer.py run end to end on the CPU (--smoke): both layouts
through the training CLI, the JSON rows, the plot and the longest-pair lines."""

import json
import os
import subprocess
import sys

import pytest

from conftest import xla_flags_with_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, timeout=600):
    # The script sets its own fake device count; conftest's collective timeouts stay.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags_with_devices(None)}
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


def test_longest_pair_search_doubles_then_bisects():
    import bench_train

    fits_up_to = 100_000
    probes = bench_train.search_longest(lambda n: {"tokens_per_s": 1.0} if n <= fits_up_to else {"skipped": "oom"},
                                        start=16384, step=8192, maximum=1 << 20)
    assert [n for n, _ in probes] == [16384, 32768, 65536, 131072, 98304, 114688, 106496]
    best = max(n for n, r in probes if "tokens_per_s" in r)
    assert best == 98304 and fits_up_to - best < 8192
    # Everything fits: doubling stops at the maximum; nothing fits: bisection below the start.
    assert [n for n, _ in bench_train.search_longest(lambda n: {"tokens_per_s": 1.0}, 64, 64, 256)] == [64, 128, 256]
    assert [n for n, _ in bench_train.search_longest(lambda n: {"skipped": "oom"}, 256, 64, 1024)] == [256, 128, 64]


def test_search_setups():
    import bench_train

    args = bench_train.parse_args(["--search", "--devices", "1,2"])
    assert bench_train.search_setups(args) == [("jax 1dev full", 1, "full"),
                                               ("jax 1dev offload_layer_inputs", 1, "offload_layer_inputs"),
                                               ("jax 2dev fsdp x seq full", 2, "full")]


@pytest.mark.slow
def test_bench_train_search_smoke(tmp_path):
    """--search through the CLI on the CPU: one probe per setup (start = max), the offloading policy included,
    with the plan's figures and the child's peak RSS in each row."""
    out = tmp_path / "search.jsonl"
    stdout = _run([os.path.join("scripts", "bench_train.py"), "--smoke", "--models", "qwen3_8b", "--stages", "bt",
                   "--devices", "1", "--search", "--search-start", "128", "--search-max", "128", "--steps", "1",
                   "--warmup", "0", "--json", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["run"], r["length"], r["remat_used"]) for r in rows] == [
        ("jax 1dev full", 128, "full"), ("jax 1dev offload_layer_inputs", 128, "offload_layer_inputs")]
    assert all(r["tokens_per_s"] > 0 and r["predicted_gib"] > 0 and r["host_rss_gib"] > 0.1 for r in rows), rows
    assert "Longest pair trained: Qwen3-8B bt jax 1dev offload_layer_inputs: 2 x 128 tokens" in stdout
