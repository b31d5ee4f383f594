"""Two CPU processes on one machine (jax.distributed, 2 devices each, data x fsdp = 2 x 2) train the same
parameters as one process with 4 devices; each process feeds only its own rows of every batch."""

import contextlib
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training import loop
from longrm_jax.training.checkpoint import load_trained_weights
from longrm_jax.training.config import load_config

from conftest import COLLECTIVE_TIMEOUT_FLAGS, xla_flags_with_devices

TINY = ["data.seq_len=256", "data.batch_rows=4", "data.synthetic.lengths=[24,40]", "data.num_train=16",
        "steps=2", "eval_before=false", "eval_after=false", "tensorboard=false", "progress=false",
        "optim.lr=1e-2", "optim.eps=1e-3", "mesh.data=2", "mesh.fsdp=2", "checkpoint.async_save=false"]


def _cmd(out, *extra):
    sets = TINY + [f"output_dir={out}"] + list(extra)
    return [sys.executable, "-m", "longrm_jax.train"] + [a for s in sets for a in ("--set", s)]


def _env(devices):
    # conftest's XLA_FLAGS with the device count replaced: its collective timeouts apply to the children too.
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags_with_devices(devices))


def _bind_shared(family, host):
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" covers IPv4 too
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def reserved_port():
    """A port no other process can take until the block ends, which the coordinator can still bind.

    The socket is bound with SO_REUSEPORT and never listens: jax's coordinator (a gRPC server, which binds with
    SO_REUSEPORT) shares the port, any other bind to it fails, and the kernel hands it to no one binding port 0.
    (Asking for a free port and closing it before the child binds it is a race another process can win.) Should
    a gRPC build ever bind without SO_REUSEPORT, the coordinator fails at once ("Failed to start RPC server").
    """
    try:
        sock = _bind_shared(socket.AF_INET6, "::")
    except OSError:  # no IPv6 on this host: gRPC then listens on 0.0.0.0 alone
        sock = _bind_shared(socket.AF_INET, "0.0.0.0")
    with sock:
        yield sock.getsockname()[1]


def run_all(cmds, *, env, log_dir, timeout_s):
    """Run `cmds` at once, each child's output going to its own file (no pipe for a child to block on), and
    return (return codes, outputs). When one fails the others are killed (they would wait for it in a
    collective); at `timeout_s` every child still running is killed and the test fails with their output."""
    logs = [open(os.path.join(log_dir, f"child{i}.log"), "w+") for i in range(len(cmds))]
    procs = []
    try:
        procs = [subprocess.Popen(c, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
                 for c, f in zip(cmds, logs)]
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]  # every child polled each round (any() would stop at the first)
            failed = any(c not in (None, 0) for c in codes)
            running = None in codes
            if not running or failed or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        timed_out = running and not failed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        outputs = []
        for f in logs:
            f.seek(0)
            outputs.append(f.read())
            f.close()
    if timed_out:
        pytest.fail(f"children still running after {timeout_s} s, killed:\n" + "\n".join(o[-2000:] for o in outputs))
    return [p.returncode for p in procs], outputs


def test_reserved_port_is_refused_to_others_and_the_coordinator_can_bind_it():
    with reserved_port() as port:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("0.0.0.0", port))
        with socket.socket() as coordinator:  # what gRPC does: SO_REUSEPORT, wildcard address, listen
            coordinator.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            coordinator.bind(("0.0.0.0", port))
            coordinator.listen()


def test_run_all_drains_big_outputs_and_kills_the_rest_when_one_fails(tmp_path):
    """2 MB of output each (far past a 64 KB pipe) cannot block a child; a child waiting forever is killed once
    its partner fails."""
    big = [sys.executable, "-c", "import sys; sys.stdout.write('x' * 2_000_000)"]
    codes, outs = run_all([big, big], env=dict(os.environ), log_dir=str(tmp_path), timeout_s=60)
    assert codes == [0, 0] and [len(o) for o in outs] == [2_000_000, 2_000_000]
    start = time.monotonic()
    codes, outs = run_all([[sys.executable, "-c", "import time; time.sleep(600)"],
                           [sys.executable, "-c", "raise SystemExit('boom')"]],
                          env=dict(os.environ), log_dir=str(tmp_path), timeout_s=60)
    assert codes[1] == 1 and "boom" in outs[1] and codes[0] != 0 and time.monotonic() - start < 30
    with pytest.raises(pytest.fail.Exception, match="still running after 1 s"):
        run_all([[sys.executable, "-c", "import time; time.sleep(600)"]], env=dict(os.environ),
                log_dir=str(tmp_path), timeout_s=1)


def test_children_keep_the_sessions_collective_timeouts():
    flags = _env(2)["XLA_FLAGS"].split()
    assert [f for f in flags if "device_count" in f] == ["--xla_force_host_platform_device_count=2"]
    assert set(COLLECTIVE_TIMEOUT_FLAGS) <= set(flags)
    flags = xla_flags_with_devices(None).split()  # a script that sets its own count
    assert not any("device_count" in f for f in flags) and set(COLLECTIVE_TIMEOUT_FLAGS) <= set(flags)


@pytest.mark.slow
def test_two_processes_match_one_process_across_a_resume(tmp_path):
    """Started as a scheduler starts them (``longrm_jax.launch``: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
    JAX_PROCESS_ID), two processes train step 1, save, stop; started again with --resume they restore the
    checkpoint across both processes (orbax) and train step 2. The weights equal one process's two steps."""
    launch = [sys.executable, "-m", "longrm_jax.launch", "-n", "2", "train"]
    # A constant learning rate: the first leg's schedule (1 step) then equals the 2-step run's first step.
    constant = ["optim.warmup_ratio=0", "optim.min_lr_ratio=1.0"]
    multi = _cmd(tmp_path / "multi", *constant)[3:]  # the train arguments
    for leg, extra in (("first", ["--set", "steps=1"]), ("resumed", ["--resume"])):
        codes, outs = run_all([launch + multi + extra], env=_env(2), log_dir=str(tmp_path), timeout_s=400)
        assert codes == [0], f"{leg} leg:\n" + outs[0][-3000:]
    assert "resum" in outs[0].lower(), outs[0][-3000:]
    # The same run in this process, on 4 of the session's 8 fake devices.
    cfg = load_config(None, TINY + constant + [f"output_dir={tmp_path / 'single'}"], base=DEFAULT_CONFIG)
    loop.run(cfg)
    assert (tmp_path / "multi" / "checkpoints" / "2").is_dir()  # the resumed leg's own step
    _, want = load_trained_weights(str(tmp_path / "single" / "checkpoints"))
    _, got = load_trained_weights(str(tmp_path / "multi" / "checkpoints"))
    assert set(got) == set(want)
    _, first = load_trained_weights(str(tmp_path / "multi" / "checkpoints"), step=1)
    moved = [k for k in got if not np.allclose(got[k], first[k], rtol=1e-3, atol=1e-4)]
    assert len(moved) > len(got) // 2, f"the resumed step left the weights (nearly) as they were: moved {moved}"
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_two_processes_report_the_held_out_accuracy_of_one_process(tmp_path):
    """Held-out evaluation under ``launch -n 2`` on fsdp=2 and on data=2: each process feeds its own rows of
    every held-out batch, the accuracy is gathered, and process 0 alone prints it. Before and after training it
    equals one process's run of the same steps."""
    held_out = ["eval_before=true", "eval_after=true", "data.num_eval=16", "mesh.data=1", "mesh.fsdp=1"]
    cfg = load_config(None, TINY + held_out + [f"output_dir={tmp_path / 'single'}"], base=DEFAULT_CONFIG)
    want = loop.run(cfg)
    assert want.accuracy_before is not None and want.accuracy_after is not None
    line = ("pairwise accuracy on held-out pairs: before "
            f"{100 * want.accuracy_before:.1f}%, after {100 * want.accuracy_after:.1f}% (2 steps)")
    launch = [sys.executable, "-m", "longrm_jax.launch", "-n", "2", "train"]
    for mesh in (["mesh.data=1", "mesh.fsdp=2"], ["mesh.data=2", "mesh.fsdp=1"]):
        out = tmp_path / mesh[0][-1]
        codes, outs = run_all([launch + _cmd(out, *held_out, *mesh)[3:]], env=_env(1), log_dir=str(tmp_path),
                              timeout_s=400)
        assert codes == [0], f"{mesh}:\n" + outs[0][-3000:]
        assert outs[0].count("pairwise accuracy on held-out pairs") == 1, outs[0][-3000:]
        assert outs[0].count("summary: ") == 1, outs[0][-3000:]
        assert line in outs[0], f"{mesh}: want {line!r}:\n" + outs[0][-3000:]
