"""Programs compiled for a TPU topology from this CPU host (``--compile-only --topology``): a tiny model's SimPO and
BT training steps with splash attention inside the ring (mesh fsdp 2 x seq 2 on a v5p-8: 4 chips), and the
evaluator's programs. A TPU program that silently fell back from splash to the XLA attention fails here: it would
hold no Mosaic TPU kernel. libtpu comes with the ``test`` extra."""

from __future__ import annotations

import importlib.util
import os

import pytest

from longrm_jax.parallel import topology as topo
from longrm_jax.parallel.compiled import hlo_op_counts
from longrm_jax.parallel.target import Target, target_of

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu not installed (pip install -e '.[test]' brings it)")


def test_topology_names():
    t = topo.parse("v5p-64")
    assert (t.platform, t.chips, t.shape, t.chip.device_kind) == ("tpu", 32, "2x4x4", "TPU v5")
    assert topo.parse("v6e-256").shape == "16x16" and topo.parse("v6e-8").chips == 8
    assert topo.parse("v5litepod-16").chip is topo.CHIPS["v5e"]
    assert topo.parse("v5p-8", slices=4).chips == 16
    gpu = topo.parse("h100x8x2")
    assert (gpu.platform, gpu.chips, gpu.shape) == ("gpu", 16, "2x1x8")
    with pytest.raises(topo.TopologyError, match="v5p comes as v5p-8, v5p-16"):
        topo.parse("v5p-12")
    with pytest.raises(topo.TopologyError, match="unknown topology 'tpu9'"):
        topo.parse("tpu9")
    assert 'major: 9' in topo.gpu_target_config("h200") and "NVIDIA H200" in topo.gpu_target_config("h200")


def test_target_follows_the_mesh_not_the_default_backend():
    from longrm_jax.parallel.mesh import make_mesh

    assert target_of().platform == "cpu"
    assert target_of(make_mesh(fsdp=2, devices=__import__("jax").devices()[:2])).platform == "cpu"
    assert Target("gpu", "NVIDIA H100 80GB HBM3", 9.0).is_gpu


def test_mesh_that_leaves_devices_unused_says_so(capsys, tmp_path):
    """A mesh over fewer (or more) devices than there are names what would fit, and the CLI refuses it as input
    (exit 2): e.g. the tiny config's fsdp 1 compiled for a v5p-8, or the SFT config's seq 8 on its 4 chips."""
    import jax

    from longrm_jax import train
    from longrm_jax.cli_support import InputError
    from longrm_jax.parallel.mesh import make_mesh

    with pytest.raises(InputError, match=r"spans 1 device, but there are 4: the mesh must use every device, so its "
                                         r"axis sizes must multiply to 4 \(e\.g\. fsdp 4 \(train: --set "
                                         r"mesh\.fsdp=4; evaluate: --mesh fsdp=4\)\)"):
        make_mesh(fsdp=1, devices=jax.devices()[:4])
    with pytest.raises(InputError, match=r"spans 8 devices, but there are 4: .*\(e\.g\. seq 4, fsdp 1 \(train: "
                                         r"--set mesh\.seq=4 --set mesh\.fsdp=1; evaluate: --mesh seq=4,fsdp=1\): "
                                         r"data x seq x tensor \(now 8\) must divide 4\)"):
        make_mesh(fsdp=1, seq=8, devices=jax.devices()[:4])
    with pytest.raises(InputError, match=r"4 devices do not divide into mesh .*the axes other than the -1 one span 8"):
        make_mesh(fsdp=-1, seq=8, devices=jax.devices()[:4])
    # the CLI: rows that do not split over data x fsdp are refused as input too (a raw IndivisibleError before)
    assert train.main(["--set", "mesh.fsdp=3", "--set", "data.batch_rows=16", "--set",
                       f"output_dir={tmp_path / 'run'}"]) == 2
    assert "data.batch_rows (16) must be a multiple of mesh data x fsdp (1 x 3 = 3)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def v5p_8():
    """The v5p-8 topology, with the persistent compilation cache (tests/conftest.py) off meanwhile: a compile-only
    TPU client stores its programs there but cannot load them back ("PjRtCompiler must be constructed with a
    Client"), so a second compile of one program would warn and compile again."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    topo.prepare_host_for_compile_only()
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once per process whether it uses the cache: ask again
    yield topo.parse("v5p-8")
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()


def _tiny(stage: str, **extra):
    from longrm_jax.train import DEFAULT_CONFIG
    from longrm_jax.training.config import load_config

    sets = [f"stage={stage}", "mesh.fsdp=2", "mesh.seq=2", "data.seq_len=512", "data.batch_rows=2",
            "model.compute_dtype=bfloat16", "model.overrides={num_layers: 1}", "data.num_rejects=1"]
    if stage == "bt":
        sets += ["lora.rank=4", "lora.alpha=4"]
    sets += [f"{k}={v}" for k, v in extra.items()]
    return load_config(None, sets, base=DEFAULT_CONFIG)


@pytest.mark.slow
@needs_libtpu
@pytest.mark.parametrize("stage", ["simpo", "bt"])
def test_tpu_train_step_keeps_splash_inside_the_ring(v5p_8, stage):
    from longrm_jax.training.compile_only import compile_train_step

    report = compile_train_step(_tiny(stage), v5p_8)
    assert report.fits, report.error
    assert report.mesh == {"data": 1, "fsdp": 2, "seq": 2, "tensor": 1}
    grads = report.kernels["gradients"]
    # splash forward + its dq and dk/dv kernels run as ring blocks: Mosaic TPU calls next to the ring's permutes
    assert grads.get("Mosaic TPU", 0) >= 3, grads
    assert grads.get("collective-permute", 0) >= 1, grads
    assert report.flops_compiled and report.flops_counted and 0 < report.peak_gib < report.hbm_gib
    text = "\n".join(report.lines)
    assert "per chip:" in text and "of 95.0 GiB HBM" in text and "Mosaic TPU" in text


@pytest.mark.slow
@needs_libtpu
def test_tpu_step_that_does_not_fit_names_predicted_and_available(v5p_8):
    from longrm_jax.training.compile_only import compile_train_step

    report = compile_train_step(_tiny("simpo", memory_budget_gib=0.001), v5p_8)
    assert not report.fits
    first = report.error.splitlines()[0]
    assert "predicted" in first and "available 1.02 MiB" in first
    assert "reduce it with:" in report.error and "mesh.seq" in report.error


@pytest.mark.slow
@needs_libtpu
def test_cli_refuses_a_hopeless_step_before_compiling(v5p_8, monkeypatch, capsys):
    """A step whose lower bound (train state + gradients + batch + stacked layer inputs) exceeds the chip exits 4
    without compiling anything (docs/compile_only.md, "Refusing early")."""
    from longrm_jax import train
    from longrm_jax.training.steps import JittedTrainStep

    monkeypatch.setattr(JittedTrainStep, "compile", lambda *_: pytest.fail("compiled a hopeless step"))
    sets = ["stage=simpo", "mesh.fsdp=2", "mesh.seq=2", "data.seq_len=512", "data.batch_rows=2",
            "model.overrides={num_layers: 1}", "model.remat=full", "memory_budget_gib=0.0001"]
    assert train.main(["--compile-only", "--topology", "v5p-8", *(a for s in sets for a in ("--set", s))]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: v5p-8: the train step does not fit the device: predicted at least "), err
    assert "(lower bound: train state" in err and "available 104.86 KiB (model.remat=full; before compiling)" in err


@pytest.mark.slow
@needs_libtpu
def test_offload_plan_on_a_program_compiled_with_a_host_memory_space(v5p_8):
    """The offloading figures of the memory plan on a real compile (issue 42; test_training_memory_plan.py's
    offload tests patch the predictions). XLA:CPU drops a pinned_host placement (jax 0.11: no host bytes in its
    memory analysis), so one chip of a v5p, whose compile-only devices have pinned_host, compiles the step: the
    gradient program keeps exactly the layers' saved inputs in host memory, at the plan's own figure for them
    (layers x tokens x hidden x bytes, the lower bound's under remat full); the plan reads it from the compiled
    memory analysis; and on these figures a host budget of 1.5 layers refuses the step, naming both sizes, and
    partial offload picks 1 of the 2 layers."""
    import jax

    from longrm_jax.ops.flash import compiling_for
    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.training import memory_plan as mp
    from longrm_jax.training.step_compile import abstract_batch
    from longrm_jax.training.compile_only import _model_config
    from longrm_jax.training.model_setup import codec_for
    from longrm_jax.training.state import abstract_state, lr_schedule, make_optimizer
    from longrm_jax.training.steps import StageSpec

    cfg = _tiny("sft", **{"mesh.fsdp": 1, "mesh.seq": 1, "data.seq_len": 128, "model.compute_dtype": "float32",
                          "model.overrides": "{num_layers: 2}", "model.remat": "offload_layer_inputs",
                          "host_memory_budget_gib": 1})
    mcfg = _model_config(cfg)[0]
    devices = v5p_8.devices()[:1]
    mesh, tx, key = make_mesh(fsdp=1, devices=devices), make_optimizer(cfg.optim, 10), jax.random.key(0)
    with compiling_for(devices):
        plan = mp.plan_train_step(cfg, mcfg, tx, lr_schedule(cfg.optim, 10), StageSpec("sft", 0, 1, False), mesh,
                                  key, device_bytes=64 * mp.GiB)
    state, _ = abstract_state(cfg, codec_for(mcfg), tx, mesh, key)
    full = mp.lower_bound(state, abstract_batch(cfg, mesh, None), mcfg, "full", 1, 1)
    assert full.layer_inputs_how == "2 layers x 256 tokens x 64 x 4 bytes"
    grads, update = plan.programs
    analysis = dict(plan.step.programs)["gradients"].memory_analysis()
    assert grads.host == analysis.host_temp_size_in_bytes == full.layer_inputs == 128 << 10
    assert update.host == 0 and mp.predicted_host(plan.programs) == grads.host
    host = 3 * full.layer_inputs // 4  # 1.5 of the 2 layers' inputs
    assert not mp.fits(plan.programs, 64 * mp.GiB, host)
    msg = mp.too_big_message(plan.programs, 64 * mp.GiB, "offload_layer_inputs", host)
    assert "predicted 128.00 KiB per device of offloaded activations, budget 96.00 KiB" in msg, msg
    assert mp.partial_offload_candidate(mp.RematCandidate("offload_layer_inputs"), plan.programs, 2, 64 * mp.GiB,
                                        host, 0).name == "offload_layer_inputs@1"


@needs_libtpu
def test_v4_chips_are_one_device_each(v5p_8):
    """v4 counts TensorCores (v4-8: 4 chips); libtpu describes a device per core unless asked for megacore, as JAX
    runs a v4 chip: the topology has one device per chip and a step compiles on it."""
    from longrm_jax.training.compile_only import compile_train_step

    v4 = topo.parse("v4-8")
    assert len(v4.devices()) == v4.chips == 4
    report = compile_train_step(_tiny("simpo", **{"mesh.fsdp": 4, "mesh.seq": 1, "data.batch_rows": 4}), v4)
    assert report.fits and report.mesh["fsdp"] == 4, report.error


@pytest.mark.slow
@needs_libtpu
def test_multislice_mesh_puts_the_slices_on_the_outer_axes(v5p_8, caplog):
    """``--topology v5p-8 --topology-slices 2``: the 8 chips of two slices. ``data`` 2 spans the slices (the
    gradient reduction is all that crosses the data-center network); with ``fsdp`` 8 alone, fsdp spans them and a
    warning says so. Both compile."""
    import logging

    import numpy as np

    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.training.compile_only import compile_train_step

    two = topo.parse("v5p-8", slices=2)
    devices = two.devices()
    mesh = make_mesh(data=2, fsdp=4, devices=devices)
    slice_of = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    assert (slice_of[0] == 0).all() and (slice_of[1] == 1).all()  # data index = slice
    with caplog.at_level(logging.WARNING):
        make_mesh(fsdp=8, devices=devices)
    assert "fsdp (2) cross the data-center network" in caplog.text
    for sizes in ({"mesh.data": 2, "mesh.fsdp": 2, "mesh.seq": 2, "data.batch_rows": 4},
                  {"mesh.fsdp": 8, "mesh.seq": 1, "data.batch_rows": 8}):
        report = compile_train_step(_tiny("simpo", **sizes), two)
        assert report.fits, report.error
        assert report.kernels["gradients"].get("Mosaic TPU", 0) >= 1


@needs_libtpu
def test_tpu_evaluator_programs_keep_splash(v5p_8):
    import jax

    from longrm_jax.evaluation.compile_only import compile_programs
    from longrm_jax.models.config import ModelConfig
    from longrm_jax.parallel.mesh import make_mesh

    mcfg = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                       num_kv_heads=2, head_dim=16, family="qwen3", qk_norm=True, pad_token_id=0, eos_token_id=2,
                       dtype="bfloat16", param_dtype="bfloat16")
    devices = v5p_8.devices()
    mesh = make_mesh(fsdp=2, seq=2, devices=devices)
    assert target_of(mesh).is_tpu and jax.default_backend() == "cpu"
    grm = compile_programs(mcfg, v5p_8, mesh, is_disrm=False, rows=2, length=512, max_new_tokens=8)
    assert [r.name.split()[0] for r in grm] == ["prefill", "decode"]
    assert grm[0].counts.get("Mosaic TPU", 0) >= 1, grm[0].counts  # the prefill's ring runs splash blocks
    disrm = compile_programs(mcfg.replace(head="classifier"), v5p_8, mesh, is_disrm=True, rows=2, length=512,
                             max_new_tokens=0)
    assert disrm[0].counts.get("Mosaic TPU", 0) >= 1, disrm[0].counts
    assert all(0 < r.peak < v5p_8.chip.hbm_bytes for r in grm + disrm)
    # FLOPs as docs/flops.md counts them, by hand for this model (XLA's figure counts loop bodies once).
    n = 1 * (64 * 4 * 16 * 2 + 64 * 2 * 16 * 2 + 3 * 64 * 128)  # attention + MLP weights of the one layer
    prompt = 2 * n * 512 + 2 * 1 * 4 * 16 * 512 ** 2
    chips = mesh.devices.size  # 4: a v5p-8 slice has 4 chips
    assert grm[0].counted == pytest.approx(2 * (prompt + 2 * 64 * 256) / chips)
    attended = sum(512 + s for s in range(1, 9))  # columns each of the 8 decode steps attends
    assert grm[1].counted == pytest.approx(2 * (8 * (2 * n + 2 * 64 * 256) + 4 * 4 * 16 * attended) / chips)
    assert disrm[0].counted == pytest.approx(2 * (prompt + 2 * 64 * 1) / chips)
    assert "per chip (XLA's cost analysis, loop bodies once:" in grm[0].describe(v5p_8.chip.hbm_bytes)


def test_hlo_op_counts():
    text = ('%a = f32[2] all-reduce-start(f32[2] %x)\n%b = f32[2] all-reduce-done(f32[2] %a)\n'
            '%c = (f32[4]) custom-call(f32[4] %y), custom_call_target="tpu_custom_call"\n'
            '%d = f32[4] collective-permute(f32[4] %y), source_target_pairs={{0,1}}\n')
    assert hlo_op_counts(text) == {"Mosaic TPU": 1, "all-reduce": 1, "collective-permute": 1}
    # FP8 matmuls (model.matmul_dtype=fp8) as a GPU program holds them: a Triton gemm fusion of f8 operands (what
    # the h100x8 compile of the tiny step showed: 30 of its 34 gemm fusions), or cuBLASLt's FP8 gemm
    fp8 = ('%gemm_fusion_dot.100_computation (parameter_0.19: f8e4m3fn[1024,64], parameter_1.19: f8e4m3fn[64,128]) '
           '-> bf16[1024,128] {\n}\n%gemm_fusion_dot.7_computation (parameter_0: bf16[8,64], parameter_1: bf16[64,8]) '
           '-> bf16[8,8] {\n}\n%e = (f32[4]) custom-call(f8e4m3fn[4] %y), custom_call_target="__cublas$lt$matmul$f8"\n')
    assert hlo_op_counts(fp8) == {"FP8 matmul": 2}


def test_cli_defaults_to_cpu_without_tpu_or_gpu(monkeypatch):
    from longrm_jax import cli_support

    env = {}
    monkeypatch.setattr(cli_support, "_libtpu_installed", lambda: True)
    cli_support.default_jax_platforms(env)
    assert env == {"JAX_PLATFORMS": "cpu"}
    env = {"JAX_PLATFORMS": "cuda"}
    cli_support.default_jax_platforms(env)
    assert env == {"JAX_PLATFORMS": "cuda"}
    monkeypatch.setattr(cli_support, "_libtpu_installed", lambda: False)
    env = {}
    cli_support.default_jax_platforms(env)
    assert env == {}


@needs_libtpu
def test_evaluate_cli_compile_only_with_default_dtype(tmp_path, capsys):
    """``python -m longrm_jax.evaluate --compile-only --topology v5p-8`` on a config-only checkpoint directory
    with the default ``--dtype auto`` (resolved as a run resolves it: a DisRM takes its stored dtype)."""
    import json

    from longrm_jax import evaluate

    config = dict(model_type="llama", architectures=["LlamaForSequenceClassification"], vocab_size=256,
                  hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-5,
                  rope_theta=10000.0, num_labels=1, pad_token_id=0, eos_token_id=2, torch_dtype="float32")
    (tmp_path / "config.json").write_text(json.dumps(config))
    rc = evaluate.main(["--model-path", str(tmp_path), "--is-disrm", "--compile-only", "--topology", "v5p-8",
                        "--compile-length", "256", "--mesh", "fsdp=4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "DisRM 1 layers, hidden 64, float32" in out and "Mosaic TPU" in out, out


@needs_libtpu
def test_evaluate_cli_compile_only_grm_with_default_budget_on_a_multislice(tmp_path, capsys):
    """``evaluate --compile-only`` for a generative judge without ``--max-new-tokens`` compiles the decode for the
    run's default budget (2,048 tokens; it failed adding None), here over two v5p-8 slices."""
    import json

    from longrm_jax import evaluate

    config = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=256, hidden_size=64,
                  intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=True, pad_token_id=0, eos_token_id=2, torch_dtype="bfloat16")
    (tmp_path / "config.json").write_text(json.dumps(config))
    rc = evaluate.main(["--model-path", str(tmp_path), "--compile-only", "--topology", "v5p-8",
                        "--topology-slices", "2", "--compile-length", "256", "--mesh", "data=2,fsdp=4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "topology 2 x v5p-8: 8 x TPU v5 (2 host(s))" in out and "GRM 1 layers" in out, out
    assert out.count("fits") >= 2 and "decode" in out, out


def test_gpu_budget_is_what_a_run_leaves_the_programs():
    """A GPU run's programs get XLA_PYTHON_CLIENT_MEM_FRACTION of the card (the README's advised 0.95 unless this
    process sets it) less ~4 GiB of cuDNN workspace; a TPU program the chip's HBM. --compile-only checks against
    that, not the whole card (a 78.3 GiB plan on an H100 said "fits" and would not run)."""
    from longrm_jax.parallel.topology import GiB, parse, program_budget

    h100 = parse("h100x1")
    budget, how = program_budget(h100, environ={})
    assert budget == int(h100.chip.hbm_bytes * 0.95) - 4 * GiB and round(budget / GiB, 1) == 71.2
    assert "95% of 79.1 GiB HBM" in how and "JAX's default is 0.75" in how
    budget, how = program_budget(h100, environ={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.75"})
    assert budget == int(h100.chip.hbm_bytes * 0.75) - 4 * GiB and "as set here" in how
    v5p = parse("v5p-8")
    assert program_budget(v5p, environ={})[0] == v5p.chip.hbm_bytes


def test_compile_table_marks_gpu_rows_close_to_the_budget(monkeypatch):
    """A GPU-mesh step compiled within GPU_COMPILE_MARGIN_GIB of the budget its compile checked is marked: a run's
    own plan on four H100s came out 2.4 GiB above its compile and refused it (docs/compile_only.md)."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")  # the compile's own budget counts, not this one's
    import compile_table

    def cell(topology, peak):
        return compile_table._cell({"peak_gib": peak, "hbm_gib": 79.1, "fits": True,
                                    "command": f"python -m longrm_jax.train --compile-only --topology {topology}",
                                    "output": ["device budget per chip 71.2 GiB: 95% of 79.1 GiB HBM"]})

    assert "close" in cell("h100x4", 69.7) and "close" not in cell("h100x4", 60.0)
    assert "close" not in cell("v5p-8", 94.0)  # TPU: the compile's figure is libtpu's own
