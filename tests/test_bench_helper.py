"""scripts/_bench.py, the benchmark scripts' shared helper: flags, when to record, median timing, the append."""

import argparse

import _bench  # scripts/ is on sys.path (pyproject's pytest pythonpath), as for `python scripts/x.py`


def _parse(argv):
    parser = argparse.ArgumentParser()
    _bench.add_common_flags(parser)
    return parser.parse_args(argv)


def test_record_path_rules(tmp_path):
    target = str(tmp_path / "b.md")
    assert _bench.record_path(_parse([])) == _bench.BENCHMARKS_MD
    assert _bench.record_path(_parse(["--smoke"])) is None  # a smoke run records only where told
    assert _bench.record_path(_parse(["--smoke", "--benchmarks-md", target])) == target
    assert _bench.record_path(_parse(["--benchmarks-md", target, "--no-record"])) is None
    args = _parse(["--iters", "3", "--warmup", "0"])
    assert (args.iters, args.warmup) == (3, 0)


def test_median_seconds_warms_up_then_takes_the_median():
    calls, synced = [], []
    seconds = _bench.median_seconds(lambda x: calls.append(x) or x, 7, iters=3, warmup=2, sync=synced.append)
    assert calls == [7] * 5 and synced == [7] * 5 and seconds >= 0.0


def test_append_section_creates_then_appends(tmp_path):
    path = str(tmp_path / "benchmarks.md")
    table = _bench.markdown_table(("impl", "TFLOP/s"), [("xla", "1.0")], "lr")
    _bench.append_section(path, "attention kernels", command="python scripts/x.py --smoke", device="1 x cpu (cpu)",
                          details="tiny", table=table, notes=["a note"])
    _bench.append_section(path, "second", command="python scripts/y.py", device="cpu")
    text = open(path).read()
    assert text.startswith("# Benchmarks\n") and text.count("# Benchmarks") == 1
    assert "## attention kernels (20" in text and "`python scripts/x.py --smoke` on 1 x cpu (cpu), tiny." in text
    assert "| impl | TFLOP/s |\n|---|---:|\n| xla | 1.0 |" in text and "- a note" in text
    assert "## second (" in text and "`python scripts/y.py` on cpu." in text
    assert _bench.hbm_bandwidth("NVIDIA H200") == 4.8e12 and _bench.hbm_bandwidth("cpu") is None
