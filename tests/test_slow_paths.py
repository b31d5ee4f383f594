"""Silent slow paths made loud (issue 29 item 15): each fallback logs one WARNING naming the reason and the fix
and is counted for the run's summary; --strict-kernels turns it into an error; the GPU benchmark scripts exit
non-zero when a kernel crashes."""

import importlib
import importlib.util
import logging
import os

import jax
import pytest

from longrm_jax.ops import cudnn_flash, cudnn_packed, dispatch, flash
from longrm_jax.parallel.target import Target

slow_paths = None  # imported per test (below): on 71596a2, where it did not exist, each test fails on its own

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch):
    global slow_paths
    try:
        slow_paths = importlib.import_module("longrm_jax.ops.slow_paths")
    except ImportError:
        yield
        return
    monkeypatch.delenv(slow_paths.STRICT_ENV, raising=False)
    slow_paths.reset()
    yield
    slow_paths.reset()


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_broken_tokamax_import_is_not_reported_as_missing(monkeypatch, caplog):
    def broken():
        raise ImportError("libcuda_tokamax.so: cannot open shared object file")

    monkeypatch.setattr(flash, "_tokamax", broken)
    for cached in (flash.tokamax_available, flash.tokamax_unavailable_reason, dispatch.warn_missing_tokamax):
        cached.cache_clear()
    monkeypatch.setattr(dispatch, "target_of", lambda *a: Target("gpu", "NVIDIA H100", 9.0))
    monkeypatch.setattr(flash, "hybrid_available", lambda *a: False)
    try:
        with caplog.at_level(logging.WARNING):
            assert dispatch.local_impl("auto") == "cudnn"
            assert dispatch.local_impl("auto") == "cudnn"
        assert _warnings(caplog) == [
            "slow path (tokamax_import): tokamax is installed, but its import fails (ImportError: "
            "libcuda_tokamax.so: cannot open shared object file): attention on this GPU falls back from the 'pallas' "
            "kernel to 'cudnn' (slower). Fix: repair the GPU extra: pip install --force-reinstall \"longrm_jax[gpu]\""]
        assert slow_paths.counts() == {"tokamax_import": 1}
        dispatch.warn_missing_tokamax.cache_clear()
        slow_paths.set_strict(True)
        with pytest.raises(slow_paths.SlowPathError, match="tokamax is installed, but its import fails"):
            dispatch.local_impl("auto")
    finally:
        for cached in (flash.tokamax_available, flash.tokamax_unavailable_reason, dispatch.warn_missing_tokamax):
            cached.cache_clear()


def test_cudnn_version_check_failure_warns_once_and_is_counted(monkeypatch, caplog):
    class FA:
        @staticmethod
        def check_cudnn_version():
            raise RuntimeError("cuDNN not found")

    monkeypatch.setattr(cudnn_flash, "_FA", FA)
    with caplog.at_level(logging.WARNING):
        assert not cudnn_packed._cudnn_version_ok()
        assert not cudnn_packed._cudnn_version_ok()
    assert _warnings(caplog) == [
        "slow path (cudnn_ragged_backward): the cuDNN version check failed (RuntimeError: cuDNN not found), so packed "
        "rows use the recomputing attention backward. Fix: install the cuDNN that the jax CUDA plugin pins (pip "
        "install \"longrm_jax[gpu]\")"]
    assert slow_paths.counts() == {"cudnn_ragged_backward": 2}
    assert slow_paths.summary_line() == ("slow paths taken: cudnn_ragged_backward x2 (reasons in the warnings above; "
                                         "--strict-kernels makes them errors)")
    FA.check_cudnn_version = staticmethod(lambda: cudnn_packed.MIN_CUDNN_VERSION - 1)
    slow_paths.set_strict(True)
    with pytest.raises(slow_paths.SlowPathError, match="older than"):
        cudnn_packed._cudnn_version_ok()


def test_cudnn_kernel_recompute_backward_is_reported(monkeypatch, caplog):
    monkeypatch.setattr(cudnn_flash, "available", lambda: False)
    with caplog.at_level(logging.WARNING):
        flash.CudnnKernel()
    (warning,) = _warnings(caplog)
    assert warning.startswith("slow path (cudnn_recompute_backward): JAX's private cuDNN API is unavailable")
    assert "Fix: use the jax version pyproject.toml pins, or impl='pallas' (tokamax)" in warning
    slow_paths.set_strict(True)
    with pytest.raises(slow_paths.SlowPathError):
        flash.CudnnKernel()


def test_failed_memory_stats_on_an_accelerator_is_reported(caplog, monkeypatch):
    from longrm_jax.evaluation.grm import continuous

    class Device:
        platform = "gpu"

        def memory_stats(self):
            raise RuntimeError("allocator stats unavailable")

    with caplog.at_level(logging.WARNING):
        assert continuous.device_memory_bytes(Device()) is None
        assert continuous.device_memory_bytes(jax.devices("cpu")[0]) is None  # a CPU has no limit: not a slow path
    (warning,) = _warnings(caplog)
    assert warning == ("slow path (eval_slots_fallback): gpu memory_stats() failed (RuntimeError: allocator stats "
                       "unavailable), so continuous GRM evaluation runs 4 slots instead of as many as the memory "
                       "holds. "
                       "Fix: pass --device-memory-gib (the device's memory) or --batch-size")
    monkeypatch.setenv(slow_paths.STRICT_ENV, "1")
    with pytest.raises(slow_paths.SlowPathError):
        continuous.device_memory_bytes(Device())


def test_clis_offer_strict_kernels(capsys):
    from longrm_jax import evaluate, train
    from longrm_jax.training.config import load_config

    for module in (evaluate, train):
        assert "--strict-kernels" in module.build_parser().format_help()
    assert load_config(None, ["strict_kernels=true"]).strict_kernels is True


def _script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_attention_exits_non_zero_when_a_kernel_crashes(monkeypatch, capsys):
    bench = _script("bench_attention")

    def crashing(name, window=None):
        def attn(q, k, v, seg=None):
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")
        return attn

    monkeypatch.setattr(bench, "jax_impl", crashing)
    assert bench.main(["--smoke", "--impls", "xla", "--lengths", "128", "--no-record"]) == 1
    assert "FAIL xla at 128: RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS" in capsys.readouterr().out


def test_bench_packed_attention_exits_non_zero_when_a_kernel_crashes(monkeypatch, capsys):
    bench = _script("bench_packed_attention")
    monkeypatch.setattr(bench, "checks", lambda args, notes: True)

    def crash(args, name, impl, seqs, t, rows):
        raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")

    monkeypatch.setattr(bench, "time_case", crash)
    assert bench.main(["--smoke", "--cases", "pair", "--no-record"]) == 1
    assert "FAIL pair xla: RuntimeError: CUDNN_STATUS_EXECUTION_FAILED" in capsys.readouterr().out
