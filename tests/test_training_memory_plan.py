"""The trainer compiles its step before loading weights and stops, before any step, when the predicted device
memory exceeds the budget; model.remat auto takes the fastest policy that fits (training.memory_plan)."""

import json
import os

import pytest

from longrm_jax.training import loop
from longrm_jax.training.config import load_config
from longrm_jax.training.memory_plan import MemoryPlanError

# 4 layers, 4 rows of 512 tokens: on the CPU the gradient program needs ~131 MiB without remat, ~76 MiB with.
TINY = ["stage=simpo", "data.seq_len=512", "data.batch_rows=4", "model.overrides={num_layers: 4}",
        "data.synthetic.lengths=[100,200]", "data.num_train=16", "data.num_eval=8", "steps=2", "log_every=1",
        "tensorboard=false", "progress=false", "checkpoint.every=0", "mesh.fsdp=1"]


def test_step_that_does_not_fit_stops_before_any_step(tmp_path):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "memory_budget_gib=0.05", "model.remat=full"])
    with pytest.raises(MemoryPlanError) as err:
        loop.run(cfg)
    msg = str(err.value)
    assert msg.startswith("the train step does not fit the device: predicted 75.87 MiB per device, available 51.20 MiB "
                          "(model.remat=full; compiled program analysis):")
    assert "gradients: train state" in msg and "model.remat=offload_layer_inputs" in msg and "mesh.seq > 1" in msg
    assert "lora.rank > 0" in msg and "model.param_dtype=bfloat16" in msg
    assert "model.remat=full (or auto" not in msg  # it is full already: the knobs named are those that change something
    assert not os.path.exists(tmp_path / "metrics.jsonl") and not os.path.exists(tmp_path / "checkpoints")


def test_remat_auto_takes_the_fastest_policy_that_fits(tmp_path, caplog):
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "memory_budget_gib=0.1", "model.remat=auto"])
    result = loop.run(cfg)
    assert result.final_step == 2
    plan = json.loads((tmp_path / "memory_plan.json").read_text())
    assert plan["remat"] == "save_attention_out" and plan["tried"][0].startswith("none ")
    assert plan["predicted_peak_gib"] <= 0.1
    # The train state (with the optimizer moments, which the gradient program never reads) counts in every program.
    grads, update = plan["programs"]
    assert grads["resident"] == update["resident"] > 0 and update["inputs"] > 0
    assert "remat: save_attention_out" in (tmp_path / "config.yaml").read_text()


# Figures of the deviceless H200 compile (Qwen3-8B BT, bf16 params, 2 x 128K rows), GiB: device peak, pinned host.
H200_2x128K = {"none": (400.0, 0.0), "save_attention_out": (242.0, 0.0), "full": (170.0, 0.0),
               "offload_layer_inputs_and_attention": (104.7, 145.1), "offload_layer_inputs": (97.6, 72.0)}


# The untiled policies of auto's order (the deviceless figures above predate the tiled MLP; its candidates are
# tested in tests/test_training_long_context.py).
def _untiled_order():
    from longrm_jax.training.remat_candidates import AUTO_REMAT_ORDER

    return tuple(c for c in AUTO_REMAT_ORDER if not c.tiled_mlp)


def _fake_compile(figures):
    from longrm_jax.training.memory_plan import GiB, ProgramMemory

    def compile_for(remat):
        device, host = figures[remat.name]
        return f"compiled {remat}", [ProgramMemory("gradients", 0, 0, 0, 0, int(device * GiB), int(host * GiB))]

    return compile_for


@pytest.mark.parametrize("host_gib,expected", [(200.0, "offload_layer_inputs_and_attention"),
                                               (96.0, "offload_layer_inputs")])
def test_auto_offloads_only_when_nothing_on_device_fits_and_within_the_host_budget(host_gib, expected):
    from longrm_jax.training.memory_plan import GiB, choose

    remat, compiled, programs, tried = choose(_fake_compile(H200_2x128K), _untiled_order(), int(132 * GiB),
                                              int(host_gib * GiB))
    assert remat.name == expected and compiled == f"compiled {expected}"
    assert tried[:3] == ["none 400.0 GiB", "save_attention_out 242.0 GiB", "full 170.0 GiB"]
    assert tried[3] == "offload_layer_inputs_and_attention 104.7 GiB + host 145.1 GiB"
    # Where an on-device policy fits, it wins (no PCIe traffic).
    assert choose(_fake_compile(H200_2x128K), _untiled_order(), int(180 * GiB), int(host_gib * GiB))[0].name == "full"


def test_offload_beyond_the_host_budget_is_refused_naming_the_host():
    from longrm_jax.training.memory_plan import GiB, choose

    with pytest.raises(MemoryPlanError) as err:
        choose(_fake_compile(H200_2x128K), _untiled_order(), int(132 * GiB), int(64 * GiB))
    msg = str(err.value)
    assert msg.startswith("the train step does not fit the host's pinned memory: predicted 72.00 GiB per device of "
                          "offloaded activations, budget 64.00 GiB (host_memory_budget_gib"), msg
    assert "pinned host 72.00 GiB" in msg
    assert "reduce it with: model.offloaded_layers=N below the model's layers" in msg  # the host is what is short


def test_partial_offload_candidate_keeps_the_host_within_budget_and_the_rest_on_the_device():
    """auto's last resort (memory_plan.partial_offload_candidate): the LoRA 2 x 256K step on an H200 with every
    layer offloaded (compiled: 55.6 GiB on the device, 128 GiB pinned) against a 96 GiB host budget: the first
    24 of 32 layers offload (96 GiB), the other 8 (32 GiB) go to the device (87.6 <= 133 GiB)."""
    from longrm_jax.training.memory_plan import GiB, ProgramMemory, partial_offload_candidate
    from longrm_jax.training.remat_candidates import RematCandidate

    programs = [ProgramMemory("gradients", 0, 0, 0, 0, int(55.6 * GiB), int(128 * GiB))]
    args = (RematCandidate("offload_layer_inputs", tiled_mlp=True), programs, 32)
    assert partial_offload_candidate(*args, int(133 * GiB), int(96 * GiB), 0).name == "offload_layer_inputs+tiled_mlp@24"
    parsed = RematCandidate.parse("offload_layer_inputs+tiled_mlp@24")
    assert (parsed.policy, parsed.tiled_mlp, parsed.offloaded_layers) == ("offload_layer_inputs", True, 24)
    # 32 GiB of moments kept on the host (optim.offload_state) stay there: 96 GiB of activations, 3 per layer.
    assert partial_offload_candidate(*args, int(133 * GiB), int(96 * GiB), 32 * GiB).name.endswith("@21")  # 64 / 3
    # No candidate where the device has no room for the rest, where the host was not what was short, or for an
    # on-device policy.
    assert partial_offload_candidate(*args, int(75 * GiB), int(96 * GiB), 0) is None
    assert partial_offload_candidate(*args, int(133 * GiB), int(200 * GiB), 0) is None
    assert partial_offload_candidate(RematCandidate("full"), programs, 32, int(133 * GiB), int(96 * GiB), 0) is None


@pytest.mark.slow
def test_auto_falls_back_to_partial_offload_through_the_cli_path(tmp_path):
    """remat auto with a device budget that only offloading meets and a host budget below what offloading
    every layer needs: the plan tries ``candidate@N`` and trains with model.offloaded_layers = N. (The CPU
    compiles host placement away, so the figures are the plan's own: memory_plan.predicted_host is patched to
    report pinned bytes per offloaded layer. The same figures on a real compile with a host memory space:
    test_compile_topology.py::test_offload_plan_on_a_program_compiled_with_a_host_memory_space.)"""
    import contextlib
    import unittest.mock as mock

    from longrm_jax.training import memory_plan

    per_layer = 64 << 20
    real_host = memory_plan.predicted_host

    def fake_host(programs):  # 4 layers x 64 MiB when all offload; the trainer's compile says how many did
        return real_host(programs) or getattr(fake_host, "layers", 4) * per_layer

    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "model.remat=auto", "memory_budget_gib=100",
                                    "host_memory_budget_gib=0.15"])
    # Every candidate that saves on the device is made too big, so auto reaches the offloading ones.
    real_peak = memory_plan.predicted_peak

    def fake_peak(programs):
        return real_peak(programs) + (200 << 30) * getattr(fake_peak, "on_device", 0)

    real_codec_for = __import__("longrm_jax.training.model_setup", fromlist=["codec_for"]).codec_for

    def codec_for(mcfg, *a, **k):  # what each compiled candidate is, for the fakes above
        offloading = mcfg.remat.startswith("offload_")
        fake_peak.on_device = 0 if offloading else 1
        fake_host.layers = (mcfg.offloaded_layers if mcfg.offloaded_layers is not None else 4) if offloading else 0
        return real_codec_for(mcfg, *a, **k)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(memory_plan, "predicted_host", fake_host))
        stack.enter_context(mock.patch.object(memory_plan, "predicted_peak", fake_peak))
        stack.enter_context(mock.patch("longrm_jax.training.model_setup.codec_for", codec_for))
        assert loop.run(cfg).final_step == 2
    plan = json.loads((tmp_path / "memory_plan.json").read_text())
    assert plan["remat"] == "offload_layer_inputs" and plan["offloaded_layers"] == 2, plan
    assert plan["tried"][-1].startswith("offload_layer_inputs+tiled_mlp@2 "), plan["tried"]
    assert "offloaded_layers: 2" in (tmp_path / "config.yaml").read_text()


def test_program_memory_reads_host_bytes():
    from types import SimpleNamespace

    from longrm_jax.training.memory_plan import ProgramMemory

    ma = SimpleNamespace(output_size_in_bytes=10, alias_size_in_bytes=0, temp_size_in_bytes=5,
                         host_argument_size_in_bytes=0, host_output_size_in_bytes=0, host_alias_size_in_bytes=0,
                         host_temp_size_in_bytes=77309411328)
    memory = ProgramMemory.of("gradients", SimpleNamespace(memory_analysis=lambda: ma), 100, 1)
    assert (memory.peak, memory.host) == (116, 77309411328)


def test_offload_policy_trains_through_the_cli_path(tmp_path):
    """The trainer compiles, plans and runs a step with an offloading policy (CPU: host placement is compiled
    away, so the plan reports no pinned bytes; the plumbing is what runs)."""
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "model.remat=offload_layer_inputs",
                                    "host_memory_budget_gib=1", "model.offloaded_layers=1"])
    assert loop.run(cfg).final_step == 2  # the first layer offloads, the other on the device
    plan = json.loads((tmp_path / "memory_plan.json").read_text())
    assert plan["remat"] == "offload_layer_inputs" and plan["predicted_host_gib"] == 0.0


def _plan(cfg, device_bytes):
    """``plan_train_step`` for ``cfg`` on one CPU device said to hold ``device_bytes`` (as ``--compile-only`` is
    given a chip's HBM)."""
    import jax

    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.training.compile_only import _model_config
    from longrm_jax.training.data_source import slots
    from longrm_jax.training.step_groups import groups_bound
    from longrm_jax.training.memory_plan import plan_train_step
    from longrm_jax.training.state import lr_schedule, make_optimizer
    from longrm_jax.training.steps import StageSpec

    mesh = make_mesh(fsdp=1, devices=jax.devices()[:1])
    spec = StageSpec(cfg.stage, cfg.data.num_rejects, groups_bound(cfg, 1), slots(cfg) is not None)
    return plan_train_step(cfg, _model_config(cfg)[0], make_optimizer(cfg.optim, 10), lr_schedule(cfg.optim, 10),
                           spec, mesh, jax.random.key(0), device_bytes=device_bytes)


def test_hopeless_step_is_refused_before_compiling(tmp_path, monkeypatch):
    from longrm_jax.training.memory_plan import GiB
    from longrm_jax.training.steps import JittedTrainStep

    def no_compile(*_):
        raise AssertionError("compiled a step that the lower bound already refuses")

    monkeypatch.setattr(JittedTrainStep, "compile", no_compile)
    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "model.remat=full"])
    with pytest.raises(MemoryPlanError) as err:
        _plan(cfg, int(0.002 * GiB))
    first, hints = str(err.value).splitlines()
    assert first.startswith("the train step does not fit the device: predicted at least "), first
    assert "(lower bound: train state " in first and " + gradients " in first and " + batch " in first
    assert "layer inputs kept for the backward" in first and "4 layers x 2,048 tokens x" in first
    assert first.endswith("available 2.05 MiB (model.remat=full; before compiling)")  # was "0.00 GiB" (issue 42)
    assert hints.startswith("reduce it with: model.remat=offload_layer_inputs")


@pytest.mark.parametrize("remat, how", [
    ("full", "4 layers x 2,048 tokens x 64 x 4 bytes"),
    ("none", "4 layers x 2,048 tokens x (64 input + 64 attention out + 128 MLP hidden) x 4 bytes")])
def test_lower_bound_is_below_the_compiled_peak(tmp_path, remat, how):
    """The bound's terms are parts of the compiled gradient program's own peak (remat full: the stacked layer
    inputs among its temporaries; none: with each layer's attention output and MLP activation too)."""
    from longrm_jax.training.memory_plan import GiB

    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", f"model.remat={remat}"])
    plan = _plan(cfg, 64 * GiB)
    grads, bound = plan.programs[0], plan.bound
    assert grads.name == "gradients" and bound.layer_inputs_how == how
    assert bound.state == grads.resident and bound.batch == grads.inputs and bound.gradients <= grads.outputs
    assert bound.layer_inputs <= grads.temp and bound.total <= grads.peak


def test_compiler_refusal_is_a_plan_outcome():
    """libtpu refuses, while compiling, a program over the chip's HBM: the plan reports it as not fitting (auto
    moves on to the next policy) with the compiler's figure, never as a crash."""
    from longrm_jax.training.memory_plan import GiB, ProgramMemory, choose

    error = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                         "temporaries (169.17G) exceeds available HBM (95.73G). HLO module: jit_gradients.")
    refused = ProgramMemory.refused_by_compiler("gradients", error, int(20 * GiB), 0)
    assert refused.temp == int(169.17 * GiB) and refused.refused.startswith("RESOURCE_EXHAUSTED")

    def compile_for(remat):
        return (None, [refused]) if remat == "full" else ("ok", [ProgramMemory("gradients", 0, 0, 0, 0, GiB)])

    assert choose(compile_for, ("full", "offload_layer_inputs"), int(95 * GiB))[:2] == ("offload_layer_inputs", "ok")
    with pytest.raises(MemoryPlanError) as err:
        choose(compile_for, ("full",), int(95 * GiB))
    msg = str(err.value)
    assert msg.startswith("the train step does not fit the device: predicted at least 189.17 GiB per device, "
                          "available 95.00 GiB (model.remat=full; the XLA compiler refused the program):"), msg
    assert "exceeds available HBM (95.73G)" in msg


def test_knobs_named_are_those_that_change_something():
    from longrm_jax.training.memory_plan import reduce_hints

    def hints(*sets, mesh=None):
        return "; ".join(reduce_hints(load_config(None, TINY + list(sets)), mesh or {"data": 1, "fsdp": 1, "seq": 1}))

    full = hints("model.remat=full")
    assert "model.remat=full" not in full and "model.remat=offload_layer_inputs" in full
    assert "model.mlp_chunk_tokens=8192" in full and "mesh.seq > 1" in full and "lora.rank > 0" in full
    assert "model.param_dtype=bfloat16" in full and "optim.offload_state=true" in full
    assert "fewer data.batch_rows" in full  # 4 rows on one device
    assert "model.remat=full (or auto" in hints("model.remat=save_attention_out")
    auto = hints("model.remat=auto")  # auto tries every policy, the tiled MLP included
    assert "model.remat" not in auto and "mlp_chunk_tokens" not in auto
    turned = hints("model.remat=offload_layer_inputs", "model.mlp_chunk_tokens=4096", "lora.rank=8",
                   "model.param_dtype=bfloat16", "optim.offload_state=true", mesh={"data": 1, "fsdp": 4, "seq": 2})
    assert turned == ("a shorter data.seq_len; mesh.seq > 2 (sequence parallel: ring attention splits the "
                      "activations over devices); more devices on mesh.fsdp (weights, gradients and optimizer "
                      "state are sharded over them)")


def test_offloaded_moments_on_devices_without_host_memory_are_moved_to_the_host_side(tmp_path, monkeypatch):
    """JAX's compile-only GPU devices have no host memory space: a ``pinned_host`` sharding comes back without its
    memory kind, so optim.offload_state's moments compile as device arguments. The plan moves them by their size:
    host memory during the gradient program (beside its activations), device memory during the update (a run
    brings them in for it), and the same state on devices that do place them gives the same gradient program."""
    from longrm_jax.training import memory_plan, state as state_mod
    from longrm_jax.training.memory_plan import GiB, bytes_per_device

    cfg = load_config(None, TINY + [f"output_dir={tmp_path}", "model.remat=full", "optim.offload_state=true"])
    placed = _plan(cfg, 64 * GiB)
    monkeypatch.setattr(state_mod, "offload_optimizer_state", lambda _cfg, sh: sh)  # the memory kind is dropped
    seen = []
    real = memory_plan.state_placement
    monkeypatch.setattr(memory_plan, "state_placement", lambda c, s: seen.append((s, real(c, s))) or seen[-1][1])
    unplaced = _plan(cfg, 64 * GiB)
    state, (device, host, moved) = seen[-1]
    moments = bytes_per_device(state.opt_state)
    assert moments > 0 and host == moved == moments
    grads, update = unplaced.programs
    assert grads.resident == device == placed.programs[0].resident
    assert grads.host == placed.programs[0].host == moments  # no offloaded activations under remat full
    assert update.resident == device + moments and update.host >= moments
    on_device = load_config(None, TINY + [f"output_dir={tmp_path}", "model.remat=full"])
    assert real(on_device, state) == (bytes_per_device(state), 0, 0)  # nothing moves without the setting
