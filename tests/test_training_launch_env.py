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
