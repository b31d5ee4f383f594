"""scripts/bench_eval.py --benchmark --smoke: the whole synthetic benchmark through `python -m
longrm_jax.evaluate` and the PyTorch peer, on tiny models on the CPU."""

import importlib.util
import os
import re

import pytest

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_report_writes_phases_without_inventing_numbers():
    import argparse

    bench = _load("bench_benchmark")
    args = argparse.Namespace(smoke=False, kinds=["grm", "disrm"], grm_preset="qwen3_8b", disrm_preset="llama31_8b",
                              max_new_tokens=2048, no_peer=False)
    ours = dict(load_s=10.0, compile_s=20.0, prefill_s=30.0, decode_s=100.0, judging_s=150.0, aggregation_s=1.0,
                wall_s=180.0, decode_tokens=5000, decode_calls=9, max_slots=8, generated_tokens=5100)
    _, lines = bench.build_report(args, {"grm": (ours, dict(load_s=5.0, run_s=300.0, wall_s=360.0)),
                                         "disrm": ({}, {})}, samples=100, lengths=[4096])
    text = "\n".join(lines)
    assert "| ours | 10.0 | 20.0 | 30.0 | 100.0 | 150.0 | 1.00 | 180.0 | 2,000.0 | 2.00x |" in text
    assert "| PyTorch peer | 5.0 | - | - | - | 300.0 | - | 360.0 | 1,000.0 | |" in text
    assert text.count("failed") == 2  # DisRM: nothing measured, nothing filled in


@pytest.mark.slow
def test_benchmark_smoke(capsys, tmp_path):
    bench = _load("bench_eval")
    assert bench.main(["--benchmark", "--smoke", "--no-record", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "failed" not in out and out.count("| PyTorch peer |") == 2
    ours, peer = re.search(r"generated tokens: ours ([\d,]+), peer ([\d,]+)", out).groups()
    assert ours == peer  # same prompts, same simulated lengths, same greedy tokens (fp32): the same work
    timings = __import__("json").loads((tmp_path / "out-grm" / "timings.json").read_text())
    for key in ("load_s", "compile_s", "prefill_s", "decode_s", "aggregation_s"):
        assert key in timings
    assert timings["device"] == "cpu"  # the device the seconds are of (a --no-peer run's report names it)
    # --peer-max-length (a bucket measured in another call is left out): every prompt of a longer bucket is
    # named as skipped, none is generated.
    capsys.readouterr()
    assert bench.main(["--benchmark", "--smoke", "--peer-part", "grm", "--peer-model", str(tmp_path / "grm"),
                       "--peer-data", str(tmp_path / "data"), "--peer-max-length", "1"]) == 0
    captured = capsys.readouterr()
    result = __import__("json").loads(captured.out.split("BENCH_RESULT", 1)[1])
    skipped = [int(n) for n in re.findall(r"\[peer\] bucket \d+: (\d+) prompts skipped", captured.err)]
    assert result["generated_tokens"] == 0 and sum(skipped) == result["sequences"] > 0
    # --peer-min-length: a bucket below it is left out likewise (its time measured in another call)
    assert bench.main(["--benchmark", "--smoke", "--peer-part", "grm", "--peer-model", str(tmp_path / "grm"),
                       "--peer-data", str(tmp_path / "data"), "--peer-min-length", str(1 << 30)]) == 0
    captured = capsys.readouterr()
    result = __import__("json").loads(captured.out.split("BENCH_RESULT", 1)[1])
    skipped = [int(n) for n in re.findall(r"\[peer\] bucket \d+: (\d+) prompts skipped", captured.err)]
    assert result["generated_tokens"] == 0 and sum(skipped) == result["sequences"] > 0
