"""mesh: auto (issue 40 item 2): the bytes each candidate mesh moves per step, the choice of the one that fits
and moves least (data parallel with ZeRO-1, FSDP, the seq ring), and a run that trains on the chosen mesh."""

import dataclasses
import json

import jax
import pytest

from longrm_jax.parallel.mesh_choice import StepTraffic, bytes_moved, candidates, resplit_rows, table
from longrm_jax.training import loop
from longrm_jax.training.config import ConfigError, load_config
from longrm_jax.training.memory_plan import MemoryPlanError
from longrm_jax.training.step_groups import groups_bound

GB = 10**9
TINY = ["stage=simpo", "model.overrides={num_layers: 2}", "data.synthetic.lengths=[20,40]", "data.num_train=16",
        "data.num_eval=8", "steps=2", "tensorboard=false", "progress=false", "checkpoint.at_end=false",
        "eval_before=false", "eval_after=false", "mesh=auto"]


def test_bytes_per_step_formula():
    t = StepTraffic(weight_bytes=16 * GB, grad_bytes=16 * GB, micro_steps=1, tokens=65_536,
                    kv_bytes_per_token=2 * 36 * 8 * 128 * 2)
    share = 7 / 8
    assert bytes_moved("data", 8, t) == round(2 * 16 * GB * share)  # reduce-scatter + all-gather = an all-reduce
    assert bytes_moved("fsdp", 8, t) == round(3 * 16 * GB * share)  # gather forward + backward, reduce-scatter
    ring = 3 * 65_536 * 2 * 36 * 8 * 128 * 2 * share  # K/V forward; K/V and dK/dV backward
    assert bytes_moved("seq", 8, t) == round(3 * 16 * GB * share + ring)
    # Every micro step gathers (fsdp) or reduces (data) again; the update's all-gather is once per step.
    t4 = StepTraffic(16 * GB, 16 * GB, micro_steps=4)
    assert bytes_moved("data", 8, t4) == round(5 * 16 * GB * share)
    assert bytes_moved("fsdp", 8, t4) == round(12 * 16 * GB * share)
    # LoRA: a frozen base is gathered by fsdp but has no gradient to reduce.
    lora = StepTraffic(weight_bytes=16 * GB, grad_bytes=GB // 100)
    assert bytes_moved("data", 8, lora) < bytes_moved("fsdp", 8, lora) == round((32 * GB + GB // 100) * share)
    assert bytes_moved("fsdp", 1, t) == 0


def test_candidates_order_and_what_the_rows_allow():
    t = StepTraffic(GB, GB, tokens=1000, kv_bytes_per_token=100)
    assert [c.kind for c in candidates(8, 16, 4096, t)] == ["data", "fsdp", "seq"]
    one_row = {c.kind: c.refused for c in candidates(8, 2, 4096, t)}
    assert "row per device" in one_row["data"] and "row per device" in one_row["fsdp"] and not one_row["seq"]
    assert "multiple of 2 x 8" in {c.kind: c.refused for c in candidates(8, 16, 100, t)}["seq"]
    assert "bucket_multiple 24 is not" in {c.kind: c.refused for c in candidates(8, 16, 4096, t, 24)}["seq"]
    only = candidates(1, 1, 7, t)
    assert len(only) == 1 and only[0].sizes == {"data": 1, "fsdp": 1, "seq": 1, "tensor": 1}
    assert table(candidates(8, 16, 4096, t), 8)[0] == "mesh auto over 8 device(s): no candidate fits"


def test_a_steps_rows_re_split_for_whole_rows_per_device():
    assert resplit_rows(4, 1, 8) == (4, 2)  # the shipped SimPO config over 4 GPUs: 1 x 8 rows as 4 x 2
    assert resplit_rows(8, 1, 8) == (8, 1) and resplit_rows(4, 1, 3) is None
    assert resplit_rows(4, 2, 6, group_rows=2) == (4, 3)  # rows layout: whole preference groups of 2 rows
    assert resplit_rows(8, 2, 6, group_rows=2) is None  # 12 rows: no multiple of 8 divides them
    t = StepTraffic(GB, GB, micro_steps=8, tokens=1000, kv_bytes_per_token=100)
    kinds = {c.kind: c for c in candidates(4, 1, 4096, t, grad_accum=8)}
    assert kinds["data"].resplit == kinds["fsdp"].resplit == (4, 2) and not kinds["data"].refused
    assert kinds["seq"].resplit is None and kinds["seq"].bytes_per_step == bytes_moved("seq", 4, t)
    assert kinds["fsdp"].bytes_per_step == bytes_moved("fsdp", 4, dataclasses.replace(t, micro_steps=2, tokens=4 * 4096))
    assert "data.batch_rows=4 x grad_accum=2 (configured 1 x 8" in kinds["data"].notes[0]
    odd = {c.kind: c.refused for c in candidates(4, 1, 4096, t, grad_accum=3)}
    assert "nor do the step's 3 rows" in odd["data"] and not odd["seq"]


def test_mesh_auto_in_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("stage: bt\nmesh: auto\n")
    assert load_config(path).mesh.auto
    assert load_config(None, ["mesh=auto"]).mesh.auto
    by_hand = load_config(path, ["mesh.seq=4"]).mesh  # an axis named on the command line: the mesh by hand
    assert (by_hand.auto, by_hand.data, by_hand.fsdp, by_hand.seq, by_hand.param_axes) == (False, 1, 1, 4,
                                                                                          ["fsdp", "seq"])
    with pytest.raises(ConfigError, match="mesh.auto chooses the axis sizes itself; drop mesh.seq"):
        load_config(None, ["mesh.auto=true", "mesh.seq=2"])


def _choose(overrides, tmp_path):
    from longrm_jax.training.compile_only import _model_config
    from longrm_jax.training.data_source import slots
    from longrm_jax.training.mesh_plan import plan_auto_mesh
    from longrm_jax.training.memory_plan import GiB
    from longrm_jax.training.state import lr_schedule, make_optimizer
    from longrm_jax.training.steps import StageSpec

    cfg = load_config(None, TINY + [f"output_dir={tmp_path}"] + overrides)
    budget = int(cfg.memory_budget_gib * GiB) if cfg.memory_budget_gib else None
    spec = StageSpec(cfg.stage, cfg.data.num_rejects, groups_bound(cfg, 1), slots(cfg) is not None)
    return plan_auto_mesh(cfg, _model_config(cfg)[0], make_optimizer(cfg.optim, 10), lr_schedule(cfg.optim, 10),
                          spec, jax.devices(), jax.random.key(0), device_bytes=budget)


@pytest.mark.slow  # compiles 8-device steps: ~10-15 s of CPU each
def test_budget_that_forbids_replicated_weights_takes_fsdp(tmp_path):
    # 7 MiB of fp32 weights, 256 tokens per step: data parallel needs 18.3 MiB per device (replicated weights
    # beside gradients and its moment shards), fsdp 12.2 MiB (XLA:CPU gathers every layer's weights at once).
    auto = _choose(["model.overrides={num_layers: 2, hidden_size: 256, intermediate_size: 1024}", "data.seq_len=32",
                    "data.batch_rows=8", "memory_budget_gib=0.014"], tmp_path)
    kinds = {c.kind: c for c in auto.candidates}
    assert kinds["data"].refused.startswith("compiled: the device: predicted 18.3"), kinds["data"].refused
    assert kinds["fsdp"].chosen and dict(auto.mesh.shape)["fsdp"] == 8 and auto.cfg.mesh.param_axes == ["fsdp"]
    assert auto.cfg.mesh.optimizer_axes is None and not auto.cfg.mesh.auto
    assert "chose fsdp=8" in auto.lines()[0] and "not tried" in auto.lines()[-1]


@pytest.mark.slow  # compiles 8-device steps: ~10-15 s of CPU each
def test_one_long_row_takes_the_ring(tmp_path):
    auto = _choose(["data.seq_len=256", "data.batch_rows=1"], tmp_path)
    kinds = {c.kind: c for c in auto.candidates}
    assert "row per device" in kinds["data"].refused and "row per device" in kinds["fsdp"].refused
    assert kinds["seq"].chosen and dict(auto.mesh.shape)["seq"] == 8
    assert auto.cfg.mesh.param_axes == ["fsdp", "seq"]  # weights sharded over the ring too, as the shipped configs


def test_nothing_fits_names_every_candidate(tmp_path, monkeypatch):
    from longrm_jax.training.steps import JittedTrainStep

    def no_compile(*_):
        raise AssertionError("compiled a candidate that the lower bound already refuses")

    monkeypatch.setattr(JittedTrainStep, "compile", no_compile)
    with pytest.raises(MemoryPlanError) as err:
        _choose(["data.seq_len=64", "data.batch_rows=8", "memory_budget_gib=0.00001"], tmp_path)
    lines = str(err.value).splitlines()
    assert lines[0] == "mesh auto: no mesh over 8 device(s) fits" and "no candidate fits" in lines[1]
    assert sum("refused: before compiling" in line for line in lines) == 3


@pytest.mark.slow  # compiles 8-device steps: ~10-15 s of CPU each
def test_run_with_mesh_auto_trains_data_parallel_with_sharded_moments(tmp_path):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "data.seq_len=64", "data.batch_rows=8"])
    result = loop.run(cfg)
    assert result.final_step == 2
    plan = json.loads((tmp_path / "memory_plan.json").read_text())
    assert plan["mesh_auto"]["chosen"] == {"data": 8, "fsdp": 1, "seq": 1, "tensor": 1}
    assert [c["kind"] for c in plan["mesh_auto"]["candidates"]] == ["data", "fsdp", "seq"]
    assert "chose data=8 (ZeRO-1)" in plan["mesh_auto"]["table"][0]
    state = result.state
    mu = next(x for x in jax.tree.leaves(state.opt_state) if x.ndim == 2)
    weight = next(x for x in jax.tree.leaves(state.params) if x.ndim == 2)
    assert weight.sharding.is_fully_replicated and not mu.sharding.is_fully_replicated  # ZeRO-1
    saved = (tmp_path / "config.yaml").read_text()
    assert "auto: false" in saved and "data: 8" in saved and "optimizer_axes:\n  - data" in saved


@pytest.mark.slow  # compiles 8-device steps and a one-device step
def test_one_row_per_micro_step_re_split_over_data_parallel_trains_as_one_device(tmp_path):
    """1 row x 8 micro steps (the shipped SimPO config's shape) over 8 devices: mesh auto takes the step's 8 rows
    as one micro step of a row per device, and the losses equal one device's run of the configured split."""
    shape = ["data.seq_len=64", "data.batch_rows=1", "grad_accum=8", "log_every=1"]
    result = loop.run(load_config(None, TINY + [f"output_dir={tmp_path / 'auto'}"] + shape))
    plan = json.loads((tmp_path / "auto" / "memory_plan.json").read_text())
    assert plan["mesh_auto"]["chosen"] == {"data": 8, "fsdp": 1, "seq": 1, "tensor": 1}
    assert "data.batch_rows=8 x grad_accum=1 (configured 1 x 8" in plan["mesh_auto"]["table"][2]
    saved = (tmp_path / "auto" / "config.yaml").read_text()
    assert "grad_accum: 1" in saved and "batch_rows: 8" in saved
    one = [x for x in TINY if x != "mesh=auto"] + ["mesh.fsdp=1", f"output_dir={tmp_path / 'one'}"] + shape
    single = loop.run(load_config(None, one))
    assert result.final_step == single.final_step == 2
    for key in ("loss", "grad_norm", "accuracy"):
        assert result.last_metrics[key] == pytest.approx(single.last_metrics[key], rel=1e-5), key


@pytest.mark.parametrize("fsdp_share, chosen", [(0.5, "fsdp"), (0.95, "data")])
def test_a_tight_fit_gives_way_to_one_with_room(monkeypatch, tmp_path, fsdp_share, chosen):
    """Data parallel fitting at 99% of the budget (as ZeRO-1 did before running out of memory on an H200) gives
    way to FSDP at half the budget, though FSDP moves more bytes; when every candidate is tight, bytes decide."""
    from longrm_jax.training import mesh_plan
    from longrm_jax.training.memory_plan import ProgramMemory, StepPlan

    budget = 100 * 2**20

    def fake_plan(run_cfg, *args, **kwargs):
        share = 0.99 if run_cfg.mesh.data > 1 else fsdp_share
        program = ProgramMemory("gradients", resident=int(share * budget), inputs=0, outputs=0, aliased=0, temp=0)
        return StepPlan("full", None, [program], ["full"], budget=budget)

    monkeypatch.setattr(mesh_plan, "plan_train_step", fake_plan)
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "data.seq_len=64", "data.batch_rows=8"])
    monkeypatch.setattr(mesh_plan, "step_traffic", lambda *a: StepTraffic(GB, GB, tokens=512, kv_bytes_per_token=100))
    auto = mesh_plan.plan_auto_mesh(cfg, None, None, None, None, jax.devices(), jax.random.key(0))
    kinds = {c.kind: c for c in auto.candidates}
    assert kinds[chosen].chosen and auto.mesh.shape[chosen] == 8
    lines = "\n".join(auto.lines())
    assert "tight: within 8% of the budget of 100.00 MiB" in lines
    if chosen == "fsdp":
        assert "not taken: fits, predicted peak 99.00 MiB" in lines and "with room to spare" in lines
    else:
        assert "all tight" in lines
