"""longrm_jax.cli_support.fake_cpu_device_threads: PJRT_NPROC for fake CPU devices (the thread-pool deadlock of their collectives)."""

import os

from longrm_jax.cli_support import THREADS_PER_FAKE_CPU_DEVICE, fake_cpu_device_threads


def test_several_fake_devices_get_threads_per_device():
    env = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8"}
    assert fake_cpu_device_threads(env) == max(os.cpu_count() or 1, THREADS_PER_FAKE_CPU_DEVICE * 8)
    assert env["PJRT_NPROC"] == str(max(os.cpu_count() or 1, 32))


def test_jax_num_cpu_devices_counts_too():
    env = {"JAX_NUM_CPU_DEVICES": "4"}
    assert fake_cpu_device_threads(env) == max(os.cpu_count() or 1, THREADS_PER_FAKE_CPU_DEVICE * 4)


def test_left_alone_when_set_or_one_device():
    for env in ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "3"},
                {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "NPROC": "3"},
                {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, {"JAX_NUM_CPU_DEVICES": "x"}, {}):
        before = dict(env)
        assert fake_cpu_device_threads(env) is None
        assert env == before


def test_the_suite_runs_with_it():
    """conftest set it for this session's 8 devices (and the CLIs set it from run_cli)."""
    assert int(os.environ["PJRT_NPROC"]) >= THREADS_PER_FAKE_CPU_DEVICE * 8
