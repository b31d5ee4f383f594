"""Test session setup: 8 fake CPU devices so distributed code is tested against single-device results."""

import os

import pytest

from skip_policy import pytest_addoption, pytest_configure  # noqa: F401 - hooks: --strict-skips (scripts/test.sh)

# Must happen before jax is imported anywhere in the test session.
os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
# XLA:CPU aborts the process ("Termination timeout ... exceeded") when a collective's rendezvous takes longer than
# its termination timeout (40 s by default). On 2 busy cores, 8 fake devices' threads can be starved for a while;
# 300 s is far above any starvation of the suite's tiny programs and still ends a real deadlock (such as the
# thread-pool one that PJRT_NPROC below prevents) well inside the per-test timeout (pyproject: 600 s).
COLLECTIVE_TIMEOUT_FLAGS = ("--xla_cpu_collective_call_terminate_timeout_seconds=300",
                            "--xla_cpu_collective_timeout_seconds=300")
# LLVM's optimisation of the CPU code of the suite's tiny programs costs more compile time than it saves run time
# (tests/test_training_reference.py: 132 -> 99 CPU s, every parity within its tolerance). HLO passes (fusion,
# layout, sharding) are unchanged: the programs are the same, only their machine code is less optimised.
CPU_COMPILE_FLAGS = ("--xla_backend_optimization_level=0",)
# For the few tests whose programs run long enough that machine code quality matters (jit(...,
# compiler_options=...)): the 20 gradients of 2 x 2,048-token real pairs ran 1.6 s each at level 0, 0.6 s at 2.
EXECUTION_HEAVY_COMPILER_OPTIONS = {"xla_backend_optimization_level": 2}
for _flag in COLLECTIVE_TIMEOUT_FLAGS + CPU_COMPILE_FLAGS:
    if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " " + _flag
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# 8 fake devices' collectives deadlock XLA:CPU's thread pool when it has as many threads as the machine has cores
# (the CI's crashed worker in test_training_distributed.py[bt]): PJRT_NPROC sizes it, inherited by the CLI
# subprocesses the tests start (longrm_jax/cli_support.py says why and what was measured).
from longrm_jax.cli_support import fake_cpu_device_threads  # noqa: E402 - imports no jax

fake_cpu_device_threads()

# One persistent XLA compilation cache for the whole run: the xdist workers and the CLI subprocesses the tests start
# inherit the environment, so a program compiled once (the tiny training step a CLI test runs, kills and resumes in
# three processes; the same step in-process test after test) is compiled once per run instead of once per
# process. A fresh directory per run (made by the controller, removed at its end) keeps runs independent of each
# other. The size limit turns on JAX's file lock, so two workers never read an entry the other is still writing.
# XLA keys entries by the program, its compile options and devices, and the jax/XLA version: a hit is the
# executable this process would have compiled (its memory and cost analyses and HLO text included), so whether a
# program was stored changes only how fast a test runs, never what it computes. Only programs that compiled in
# 0.1 s or more are stored: with the size limit, every store lists and stats the whole directory (JAX's LRU
# eviction), and storing every program (threshold 0) made those scans quadratic in the run's thousands of small
# programs: 100 of the suite's 1,057 CPU seconds (py-spy, 2026-11-26), against 8 s of reads. The training step
# a CLI test compiles in three processes takes seconds. (The compilation-cache test sets its own threshold 0.)
_OWN_XLA_CACHE = None  # the directory this process made (and removes at its end)
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ:
    import tempfile

    _OWN_XLA_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="longrm_test_xla_cache_")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The real upstream sample rows: shared/ lies beside the repository (the CI clone has it there too);
# LONGRM_UPSTREAM_DATA overrides.
UPSTREAM_DATA = os.environ.get("LONGRM_UPSTREAM_DATA") or os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "longrm_upstream"))
# The one mark of every test that reads them: tests/allowed_skips.txt counts the tests carrying its reason
# (tests/skip_policy.py), which a runtime pytest.skip would hide from.
UPSTREAM_ROWS_MISSING = "upstream sample rows not present"
needs_upstream_rows = pytest.mark.skipif(
    not all(os.path.isdir(os.path.join(UPSTREAM_DATA, d)) for d in ("SimPO_Data_Sampled20", "SFT_Data_Sampled20")),
    reason=UPSTREAM_ROWS_MISSING)


def xla_flags_with_devices(count: int | None) -> str:
    """This session's XLA_FLAGS for a child process with `count` fake CPU devices (None: none set, the child
    chooses): the device count replaced, the collective timeouts above kept."""
    flags = [f for f in os.environ["XLA_FLAGS"].split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join(flags + ([] if count is None else [f"--xla_force_host_platform_device_count={count}"]))


def pytest_unconfigure(config):
    """The process that made the compilation cache (the xdist controller, or a run without xdist) removes it."""
    if _OWN_XLA_CACHE:
        import shutil

        shutil.rmtree(_OWN_XLA_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Files holding a slow test run first, each file's tests kept together (module fixtures set up once), the
    rest in their usual order after them. Two xdist workers then start the long files and fill in with the short
    ones: a long test collected last (test_training_* sort last) would otherwise run alone at the end of the run
    while the other worker idles. Every worker collects the same order, as xdist requires."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file's order is kept
