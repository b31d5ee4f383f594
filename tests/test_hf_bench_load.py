"""Smoke test of scripts/bench_load.py --smoke (the 8B run is a GPU benchmark, not a test)."""

import os
import runpy

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "bench_load.py")


def test_bench_load_tiny_smoke(tmp_path, capsys):
    bench = runpy.run_path(SCRIPT, run_name="bench_load")
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n")
    rc = bench["main"](["--smoke", "--work-dir", str(tmp_path / "ckpt"), "--benchmarks-md", str(md)])
    out = capsys.readouterr().out
    assert rc == 0 and "load time" in out and "peak / weights" in out
    assert "## checkpoint load (" in md.read_text() and "| weights GiB | load s |" in md.read_text()
    # the synthetic checkpoint is HF-shaped: the shapes table covers every tensor a Llama needs
    shapes = bench["hf_tensor_shapes"](dict(bench["SHAPES"]["qwen3"], **bench["TINY"]))
    assert shapes["model.layers.3.self_attn.q_norm.weight"] == (32,)
    with pytest.raises(SystemExit):
        bench["main"](["--help"])
