"""Multi-process (multi-host) start-up: ``jax.distributed.initialize`` when configured or detected.

Must run before anything touches a JAX device. With N processes every process runs the same program; each
feeds its own ``B / N`` rows of every global batch (``training.batches.process_rows``) and only process 0
writes logs, metrics and progress (orbax coordinates checkpoint writes itself).
"""

from __future__ import annotations

import logging
import os

import jax

from longrm_jax.cli_support import InputError
from longrm_jax.training.config_schema import DistributedSection

log = logging.getLogger(__name__)

# The largest share of each GPU JAX's allocator may take in a multi-process run. NCCL allocates its buffers
# for other processes' GPUs outside that pool: with 4 processes of one GPU each, the README's 0.95 leaves 4 GiB
# of an 80 GiB GPU, too little ("Cuda failure 2 'out of memory'" in the update's collectives), where one process
# driving the same 4 GPUs, or 4 processes on 141 GiB GPUs, fit (docs/benchmarks.md, the "4 processes" paragraph).
MULTI_PROCESS_GPU_MEM_FRACTION = 0.90

# Environment variables that mean "this is one process of a multi-process job".
_CLUSTER_ENV = ("JAX_COORDINATOR_ADDRESS", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE",
                "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


def cluster_detected() -> bool:
    """A multi-process environment: SLURM / Open MPI with more than one task, a TPU pod slice, or an explicit
    coordinator address."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS") or (_env_int("JAX_NUM_PROCESSES") or 1) > 1:
        return True
    for var in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        if int(os.environ.get(var, "1") or 1) > 1:
            return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return "," in hosts


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"environment variable {name}={value!r} is not an integer") from None


def launch_settings(cfg: DistributedSection) -> dict:
    """``jax.distributed.initialize`` arguments from the config, else from ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID`` (what a Kubernetes JobSet or a plain launcher exports beside ``JAX_COORDINATOR_ADDRESS``,
    which jax reads itself, as it reads ``JAX_LOCAL_DEVICE_IDS``); what neither gives, jax detects (SLURM, Open
    MPI, TPU pods)."""
    settings = {"coordinator_address": cfg.coordinator_address,
                "num_processes": cfg.num_processes if cfg.num_processes is not None else _env_int("JAX_NUM_PROCESSES"),
                "process_id": cfg.process_id if cfg.process_id is not None else _env_int("JAX_PROCESS_ID")}
    return {k: v for k, v in settings.items() if v is not None}


def maybe_initialize(cfg: DistributedSection) -> bool:
    """Initialise the distributed runtime if ``cfg`` asks for it or a cluster is detected; returns whether it
    is initialised. Explicit fields (coordinator address, process count and id) win over the environment."""
    if jax.distributed.is_initialized():
        return True
    explicit = cfg.coordinator_address is not None or cfg.num_processes is not None
    if cfg.mode == "off" or (cfg.mode == "auto" and not explicit and not cluster_detected()):
        return False
    leave_room_for_nccl()
    jax.distributed.initialize(**launch_settings(cfg))
    return True


def leave_room_for_nccl(environ=None) -> float | None:
    """Cap ``XLA_PYTHON_CLIENT_MEM_FRACTION`` at ``MULTI_PROCESS_GPU_MEM_FRACTION`` in this process's environment
    (read when the GPU backend starts, which is after this); returns the fraction set, None if left alone."""
    environ = os.environ if environ is None else environ
    value = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "").strip()
    try:
        fraction = float(value) if value else None
    except ValueError:
        raise InputError(f"environment variable XLA_PYTHON_CLIENT_MEM_FRACTION={value!r} is not a number") from None
    if fraction is None or fraction <= MULTI_PROCESS_GPU_MEM_FRACTION:
        return None
    environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{MULTI_PROCESS_GPU_MEM_FRACTION:g}"
    log.warning("multi-process run: XLA_PYTHON_CLIENT_MEM_FRACTION %g -> %g, leaving each GPU room for NCCL's "
                "buffers outside JAX's pool (at 0.95 an 80 GiB GPU ran out of memory in NCCL)", fraction,
                MULTI_PROCESS_GPU_MEM_FRACTION)
    return MULTI_PROCESS_GPU_MEM_FRACTION
