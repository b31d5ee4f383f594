"""The CPU has a memory guard too (issue 42 item 3): a step or data batches the host's free RAM cannot hold are
refused before anything is allocated, exit 4, with the figures (in units that tell them apart) and the knobs;
runs that fit are not refused (training.host_memory, training.memory_plan)."""

import pytest

from longrm_jax.training import host_memory
from longrm_jax.training.config import load_config
from longrm_jax.training.host_memory import GiB, HostMemoryError

TINY = ["stage=simpo", "data.seq_len=512", "data.batch_rows=4", "model.overrides={num_layers: 4}",
        "data.synthetic.lengths=[100,200]", "data.num_train=16", "data.num_eval=8", "steps=2", "tensorboard=false",
        "progress=false", "checkpoint.every=0", "mesh.fsdp=1"]


def test_sizes_print_in_units_that_tell_them_apart():
    assert host_memory.format_bytes(0.001 * GiB) == "1.02 MiB"  # was "0.00 GiB"
    assert host_memory.format_bytes(827.2 * GiB) == "827.20 GiB" and host_memory.format_bytes(444) == "444 bytes"
    assert host_memory.format_sizes(64 * GiB, 64 * GiB + 2**20) == ["64.000 GiB", "64.001 GiB"]
    assert host_memory.format_sizes(3 * GiB, 3 * GiB) == ["3.00 GiB", "3.00 GiB"]


def test_data_batches_the_host_cannot_hold_are_refused_naming_the_knobs():
    cfg = load_config(None, ["data.seq_len=100000000", "data.batch_rows=16", "steps=5"])
    with pytest.raises(HostMemoryError) as err:
        host_memory.check_data_buffers(cfg, available=22 * GiB)
    msg = str(err.value)
    assert err.value.exit_code == 4 and "\n" not in msg
    assert msg.startswith("the data batches do not fit this host's memory: a training batch of 16 rows x "
                          "100,000,000 tokens (23.84 GiB, 4 int32 arrays) and the held-out pairs' first batch "
                          "(23.84 GiB) need at least 47.68 GiB, available 22.00 GiB"), msg
    assert "a shorter data.seq_len" in msg and "eval_before=false, eval_after=false and eval_every=0" in msg
    # Without held-out pairs only the training batch counts; memory_check=false skips the check.
    host_memory.check_data_buffers(load_config(None, ["data.seq_len=100000000", "data.batch_rows=16",
                                                      "eval_before=false", "eval_after=false"]), available=24 * GiB)
    host_memory.check_data_buffers(load_config(None, ["data.seq_len=100000000", "memory_check=false"]),
                                   available=GiB)
    host_memory.check_data_buffers(load_config(None, TINY), available=GiB)  # 4 x 512 tokens: 32 KiB


def test_cpu_budget_is_the_free_ram_less_the_batches_in_flight_over_the_devices():
    cfg = load_config(None, TINY)  # a training batch: 4 rows x 512 tokens x 16 bytes + 4 x 4
    batch = 4 * (512 * 16 + 4)
    assert host_memory.train_batch_bytes(cfg) == batch
    assert host_memory.cpu_device_budget(cfg, 8, available=10 * GiB) == int((0.9 * 10 * GiB - 2 * batch) // 8)
    assert host_memory.cpu_device_budget(cfg, 1, available=0) == 0


def test_cgroup_limit_caps_the_available_memory(tmp_path, monkeypatch):
    (tmp_path / "memory.max").write_text("4294967296\n")
    (tmp_path / "memory.current").write_text(str(3 * GiB) + "\n")
    (tmp_path / "memory.stat").write_text(f"anon 1\ninactive_file {GiB // 2}\n")  # page cache the kernel can drop
    monkeypatch.setattr(host_memory, "_cgroup_dirs",
                        lambda: [(str(tmp_path), "memory.max", "memory.current", "memory.stat")])
    monkeypatch.setattr(host_memory, "_meminfo_available", lambda: 20 * GiB)
    assert host_memory.available_bytes() == 4 * GiB - (3 * GiB - GiB // 2)
    (tmp_path / "memory.max").write_text("max\n")  # no limit: MemAvailable
    assert host_memory.available_bytes() == 20 * GiB


def test_train_cli_refuses_a_100m_token_row_in_seconds_with_exit_4(tmp_path, monkeypatch, capsys):
    """Was the OOM killer (exit 137, no message) on a 23 GiB machine: the held-out batches were packed first."""
    from longrm_jax import train

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 22 * GiB)
    rc = train.main(["--set", "data.seq_len=100000000", "--set", "steps=5", "--set", f"output_dir={tmp_path}/run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 4 and err[-1].startswith("error: the data batches do not fit this host's memory"), err


def test_train_cli_refuses_100000_rows_before_compiling_with_exit_4(tmp_path, monkeypatch, capsys):
    """The default run with data.batch_rows=100000 (remat none; 827 GiB compiled): refused by the lower bound,
    whose layers keep their attention outputs and MLP activations for the backward, before the step's compile
    (issue 42: 44 s to refuse under load, all but 12 s of it building and compiling that program)."""
    from longrm_jax import train
    from longrm_jax.training.steps import JittedTrainStep

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 22 * GiB)
    monkeypatch.setattr(JittedTrainStep, "compile", lambda *_: pytest.fail("compiled a step the bound refuses"))
    rc = train.main(["--set", "data.batch_rows=100000", "--set", f"output_dir={tmp_path}/run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 4 and err[-1].startswith("error: the train step does not fit the device: predicted at least "
                                          "49.40 GiB per device"), err
    assert ("activations kept for the backward 48.8 GiB (2 layers x 25,600,000 tokens x (64 input + 64 attention "
            "out + 128 MLP hidden) x 4 bytes)") in err[-1] and "(model.remat=none; before compiling)" in err[-1]


def test_cpu_step_over_the_free_ram_is_refused_with_the_budget_named(monkeypatch):
    """The memory plan on the CPU backend: the free RAM is the devices' budget (was: no check, then
    RESOURCE_EXHAUSTED after compiling 827 GiB of data.batch_rows=100000). Refused by the lower bound here,
    before compiling."""
    import jax

    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.training.compile_only import _model_config
    from longrm_jax.training.step_groups import groups_bound
    from longrm_jax.training.memory_plan import MemoryPlanError, plan_train_step
    from longrm_jax.training.state import lr_schedule, make_optimizer
    from longrm_jax.training.steps import StageSpec

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2 * 2**20)
    cfg = load_config(None, TINY + ["model.remat=full"])
    mesh = make_mesh(fsdp=1, devices=jax.devices()[:1])
    with pytest.raises(MemoryPlanError) as err:
        plan_train_step(cfg, _model_config(cfg)[0], make_optimizer(cfg.optim, 10), lr_schedule(cfg.optim, 10),
                        StageSpec("simpo", 1, groups_bound(cfg, 1), False), mesh, jax.random.key(0))
    first, hints, budget = str(err.value).splitlines()
    assert err.value.exit_code == 4 and "available 1.74 MiB (model.remat=full; before compiling)" in first, first
    assert "a shorter data.seq_len" in hints
    assert budget.startswith("(CPU backend: the budget is 90% of the host's free RAM now")
