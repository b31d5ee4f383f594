"""scripts/profile_summary.py's compute / communication overlap, on hand-made kernel timelines (a real GPU trace
needs a GPU; the CPU trace path is covered by tests/test_training_cli.py)."""

import importlib.util
import os

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "profile_summary", os.path.join(os.path.dirname(__file__), "..", "scripts", "profile_summary.py"))
profile_summary = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(profile_summary)


def test_exposed_collective_is_the_part_no_compute_kernel_covers():
    s = 1_000_000_000  # ns
    kernels = [
        ("fusion_1", 0, 4 * s),                   # main stream
        ("flash_attention_kernel", 3 * s, 6 * s),  # a side stream, overlapping the main one for 1 s
        ("ncclDevKernel_SendRecv", 5 * s, 8 * s),  # 1 s under compute, 2 s exposed
        ("ncclDevKernel_AllGather", 7 * s, 9 * s),  # overlaps the SendRecv: union 5-9 s, exposed 6-9 s
        ("MemcpyD2D", 8 * s, 10 * s),              # a copy: neither compute nor collective
    ]
    o = profile_summary.overlap(kernels)
    assert o["compute_busy_s"] == pytest.approx(6.0)
    assert o["collective_busy_s"] == pytest.approx(4.0)
    assert o["exposed_collective_s"] == pytest.approx(3.0)


def test_no_collectives_nothing_exposed():
    o = profile_summary.overlap([("gemm", 0, 10), ("gemm", 5, 20)])
    assert o == {"compute_busy_s": 20e-9, "collective_busy_s": 0.0, "exposed_collective_s": 0.0}


def test_events_keep_every_kernel_of_every_device(tmp_path):
    """``--events``: the compact timeline holds each kernel's device, line, name, start (from the trace's first
    kernel) and duration; module lines other than "XLA Ops" are left out."""
    from types import SimpleNamespace as NS

    import numpy as np

    def ev(name, start, dur):
        return NS(name=name, start_ns=start, duration_ns=dur)

    planes = [NS(name="/device:GPU:0", lines=[NS(name="Stream #1", events=[ev("gemm", 100, 5), ev("nccl", 110, 3)]),
                                              NS(name="XLA Modules", events=[ev("jit_step", 100, 20)])]),
              NS(name="/device:GPU:1", lines=[NS(name="Stream #1", events=[ev("gemm", 150, 7)]),
                                              NS(name="XLA Ops", events=[ev("fusion.1", 150, 7)])])]
    path = str(tmp_path / "ev.npz")
    profile_summary.write_events(planes, path)
    z = np.load(path)
    rows = [(str(z["devices"][d]), str(z["lines"][ln]), str(z["names"][n]), int(s), int(t))
            for d, ln, n, s, t in zip(z["device"], z["line"], z["name"], z["start_ns"], z["dur_ns"])]
    assert rows == [("/device:GPU:0", "Stream #1", "gemm", 0, 5), ("/device:GPU:0", "Stream #1", "nccl", 10, 3),
                    ("/device:GPU:1", "Stream #1", "gemm", 50, 7), ("/device:GPU:1", "XLA Ops", "fusion.1", 50, 7)]
