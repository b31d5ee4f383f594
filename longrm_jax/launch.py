"""Start one process per GPU on this machine, as a cluster scheduler would: ``python -m longrm_jax.launch``.

Each child is ``python -m longrm_jax.<command> ARGS`` with the variables a Kubernetes JobSet or SLURM wrapper
exports: ``JAX_COORDINATOR_ADDRESS`` (a free port on this host), ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` and,
on a GPU machine, ``JAX_LOCAL_DEVICE_IDS`` (process i drives GPU i). ``training.distributed`` turns these into
``jax.distributed.initialize``; every process then runs the same program on its own rows. On a cluster use the
scheduler itself (README, "Several GPUs and hosts"; docs/scaling.md); this is the one-host equivalent, and what
the tests run.

Ctrl-C and SIGTERM are passed to every child (each saves a checkpoint at the step reached). When one child
fails, the others are stopped (they would wait for it in a collective) and its exit status is returned.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from longrm_jax.cli_support import InputError, add_debug_flag, cli_parser, run_cli, visible_gpu_ids

# Only training starts jax.distributed (training.distributed); evaluate runs one process over all local GPUs.
COMMANDS = ("train",)
STOP_GRACE_S = 60  # after a child fails: how long the others get to end on SIGTERM before SIGKILL


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gpu_count() -> int:
    return len(visible_gpu_ids())


def child_env(process_id: int, num_processes: int, port: int, devices_per_process: int, environ=None) -> dict:
    """The environment of child ``process_id``."""
    env = dict(os.environ if environ is None else environ)
    env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(num_processes),
               JAX_PROCESS_ID=str(process_id))
    if devices_per_process:
        first = process_id * devices_per_process
        env["JAX_LOCAL_DEVICE_IDS"] = ",".join(str(first + i) for i in range(devices_per_process))
    return env


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser("longrm_jax.launch", __doc__.split("\n\n")[0],
                   examples=["python -m longrm_jax.launch -n 4 train --config configs/qwen3_8b_grm_simpo.yaml "
                             "--set mesh.fsdp=4"])
    p.add_argument("-n", "--nproc", type=int, required=True, help="processes to start")
    p.add_argument("--devices-per-process", type=int, default=None,
                   help="GPUs each process drives (default: 1 on a GPU machine, none named on a CPU one)")
    p.add_argument("--port", type=int, default=None, help="coordinator port on this host (default: a free one)")
    add_debug_flag(p)
    p.add_argument("command", choices=COMMANDS, help="the CLI each process runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _stop(procs, sig) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)


def _wait(procs) -> int:
    """Wait for every child; the first non-zero status stops the rest and is returned (a child killed by signal N
    as 128 + N, the shell's status for it), after a line saying which process ended how."""
    while True:
        codes = [p.poll() for p in procs]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            index = codes.index(failed)
            if failed < 0:
                name = signal.Signals(-failed).name if -failed in signal.Signals._value2member_map_ else -failed
                print(f"launch: process {index} was killed by {name}; stopping the others", file=sys.stderr)
                failed = 128 - failed
            else:
                print(f"launch: process {index} exited with status {failed}; stopping the others", file=sys.stderr)
            _stop(procs, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.5)
            _stop(procs, signal.SIGKILL)
            return failed
        if None not in codes:
            return 0
        time.sleep(0.2)


def _launch(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.nproc < 1:
        raise InputError(f"--nproc must be at least 1, got {args.nproc}")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise InputError(f"--port must be in [1, 65535], got {args.port}")
    per = args.devices_per_process
    if per is None:
        per = 1 if _gpu_count() else 0
    if per and args.nproc * per > _gpu_count():
        raise InputError(f"{args.nproc} processes x {per} GPU(s) need {args.nproc * per} GPUs; this machine shows "
                         f"{_gpu_count()} (CUDA_VISIBLE_DEVICES or /dev/nvidia*)")
    port = args.port or _free_port()
    cmd = [sys.executable, "-m", f"longrm_jax.{args.command}", *[a for a in args.args if a != "--"]]
    procs = [subprocess.Popen(cmd, env=child_env(i, args.nproc, port, per)) for i in range(args.nproc)]
    forward = lambda sig, _frame: _stop(procs, sig)  # noqa: E731 - each child saves and exits on its own
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    return _wait(procs)


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_launch, argv)


if __name__ == "__main__":
    sys.exit(main())
