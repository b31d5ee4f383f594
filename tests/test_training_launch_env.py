"""How a process of a multi-process job learns its place: the config's distributed fields, else the variables a
Kubernetes JobSet or a plain launcher exports (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID),
else what jax detects itself (SLURM, Open MPI, TPU pods)."""

import pytest

from longrm_jax.cli_support import InputError
from longrm_jax.training.config import DistributedSection
from longrm_jax.training.distributed import cluster_detected, launch_settings

CLUSTER_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "SLURM_STEP_NUM_TASKS",
                "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES")


@pytest.fixture
def clean_env(monkeypatch):
    for var in CLUSTER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_jobset_variables_are_read(clean_env):
    clean_env.setenv("JAX_COORDINATOR_ADDRESS", "leader-0.job:1234")
    clean_env.setenv("JAX_NUM_PROCESSES", "4")
    clean_env.setenv("JAX_PROCESS_ID", "3")
    assert cluster_detected()
    # the address is left to jax, which reads the same variable
    assert launch_settings(DistributedSection()) == {"num_processes": 4, "process_id": 3}


def test_config_fields_win_over_the_environment(clean_env):
    clean_env.setenv("JAX_NUM_PROCESSES", "4")
    clean_env.setenv("JAX_PROCESS_ID", "3")
    cfg = DistributedSection(coordinator_address="h:1", num_processes=2, process_id=1)
    assert launch_settings(cfg) == {"coordinator_address": "h:1", "num_processes": 2, "process_id": 1}


def test_slurm_leaves_everything_to_jax(clean_env):
    clean_env.setenv("SLURM_STEP_NUM_TASKS", "8")
    assert cluster_detected() and launch_settings(DistributedSection()) == {}


def test_one_process_is_no_cluster(clean_env):
    assert not cluster_detected() and launch_settings(DistributedSection()) == {}
    clean_env.setenv("JAX_NUM_PROCESSES", "1")
    assert not cluster_detected()


def test_a_bad_count_names_the_variable(clean_env):
    clean_env.setenv("JAX_NUM_PROCESSES", "four")
    with pytest.raises(InputError, match="JAX_NUM_PROCESSES='four' is not an integer"):
        launch_settings(DistributedSection())


def test_launcher_refuses_bad_counts_before_starting_anything(clean_env, capsys):
    from longrm_jax import launch

    assert launch.main(["-n", "0", "train"]) == 2
    assert "--nproc must be at least 1" in capsys.readouterr().err
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert launch.main(["-n", "2", "train"]) == 2
    assert "2 processes x 1 GPU(s) need 2 GPUs; this machine shows 1" in capsys.readouterr().err


def test_each_child_gets_its_place_and_its_gpus():
    from longrm_jax.launch import child_env

    env = child_env(2, 4, 1234, 2, environ={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
                   "JAX_PROCESS_ID": "2", "JAX_LOCAL_DEVICE_IDS": "4,5"}
    assert "JAX_LOCAL_DEVICE_IDS" not in child_env(0, 2, 1, 0, environ={})  # CPU: each child its own devices


def test_multi_process_gpu_pool_leaves_room_for_nccl():
    """4 processes of one H100 each at XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 failed in NCCL ('out of memory'):
    a multi-process run caps the fraction at 0.90 before the backend starts; lower or unset is left alone."""
    from longrm_jax.training.distributed import MULTI_PROCESS_GPU_MEM_FRACTION, leave_room_for_nccl

    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"}
    assert leave_room_for_nccl(env) == MULTI_PROCESS_GPU_MEM_FRACTION == 0.90
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"
    for value in ("0.75", "0.9"):
        env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": value}
        assert leave_room_for_nccl(env) is None and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == value
    assert leave_room_for_nccl({}) is None
    with pytest.raises(InputError, match="XLA_PYTHON_CLIENT_MEM_FRACTION"):
        leave_room_for_nccl({"XLA_PYTHON_CLIENT_MEM_FRACTION": "most"})


def test_a_child_killed_by_a_signal_is_named_and_gives_128_plus_the_signal(capsys):
    """kill -9 of one child: the launcher says which process died and how, stops the others and exits 137 (the
    shell's status for SIGKILL), not the 247 of a negative status."""
    import subprocess
    import sys as _sys

    from longrm_jax.launch import _wait

    killed = subprocess.Popen([_sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    waiting = subprocess.Popen([_sys.executable, "-c", "import time; time.sleep(60)"])
    assert _wait([killed, waiting]) == 137
    assert waiting.poll() is not None
    assert "launch: process 0 was killed by SIGKILL; stopping the others" in capsys.readouterr().err
