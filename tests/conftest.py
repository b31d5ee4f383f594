"""Test session setup: 8 fake CPU devices so distributed code is tested against single-device results."""

import os

from skip_policy import pytest_addoption, pytest_configure  # noqa: F401 - hooks: --strict-skips (scripts/test.sh)

# Must happen before jax is imported anywhere in the test session.
os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
# XLA:CPU aborts the process ("Termination timeout ... exceeded") when a collective's rendezvous takes longer than
# its termination timeout (40 s by default). On 2 busy cores, 8 fake devices' threads can be starved that long:
# the CI's 8-device training test most likely died this way (a crashed xdist worker, twice in a row on
# 2026-11-25 while another test run shared the cores; passing alone). 300 s is far above any starvation of the
# suite's tiny programs and still ends a real deadlock well inside the per-test timeout (pyproject: 600 s).
COLLECTIVE_TIMEOUT_FLAGS = ("--xla_cpu_collective_call_terminate_timeout_seconds=300",
                            "--xla_cpu_collective_timeout_seconds=300")
for _flag in COLLECTIVE_TIMEOUT_FLAGS:
    if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " " + _flag
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The real upstream sample rows: shared/ lies beside the repository (the CI clone has it there too);
# LONGRM_UPSTREAM_DATA overrides.
UPSTREAM_DATA = os.environ.get("LONGRM_UPSTREAM_DATA") or os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "longrm_upstream"))


def xla_flags_with_devices(count: int | None) -> str:
    """This session's XLA_FLAGS for a child process with `count` fake CPU devices (None: none set, the child
    chooses): the device count replaced, the collective timeouts above kept."""
    flags = [f for f in os.environ["XLA_FLAGS"].split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join(flags + ([] if count is None else [f"--xla_force_host_platform_device_count={count}"]))
