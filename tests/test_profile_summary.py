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
