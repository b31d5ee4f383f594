"""The training CLI for the few tests whose steps spend their time running, not compiling (hundreds of steps that
must learn): in a subprocess whose XLA:CPU optimises the machine code at ``conftest.EXECUTION_HEAVY_COMPILER_OPTIONS``'
level (LLVM 2), where the suite's level 0 (``conftest.CPU_COMPILE_FLAGS``) ran those steps about twice as long.
An in-process test cannot change the level of the trainer's programs: XLA reads XLA_FLAGS once per process."""

from __future__ import annotations

import os
import subprocess
import sys


def execution_heavy_env(devices: int = 1) -> dict:
    """This session's environment for a child on ``devices`` fake CPU devices: the suite's XLA flags (collective
    timeouts) with the optimisation level raised."""
    from conftest import EXECUTION_HEAVY_COMPILER_OPTIONS, xla_flags_with_devices

    level = EXECUTION_HEAVY_COMPILER_OPTIONS["xla_backend_optimization_level"]
    flags = [f for f in xla_flags_with_devices(devices).split() if not f.startswith("--xla_backend_optimization_level")]
    flags.append(f"--xla_backend_optimization_level={level}")
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(flags))


def train_cli(args: list[str], *, timeout: int = 500) -> subprocess.CompletedProcess:
    """``python -m longrm_jax.train ARGS`` on one fake CPU device at the execution-heavy level; fails the test
    with the end of its output unless it exits 0."""
    proc = subprocess.run([sys.executable, "-m", "longrm_jax.train", *args], env=execution_heavy_env(1),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
