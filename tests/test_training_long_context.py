"""Long rows on one GPU (issue 30): the sequence-tiled MLP, LoRA as layer branches on a frozen (bf16) base,
the honest LoRA FLOP count, and the memory plan's tiled candidates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax.models.config import ModelConfig
from longrm_jax.models.heads import build_model
from longrm_jax.training import lora
from longrm_jax.training.memory_plan import GiB, MemoryPlanError, choose
from longrm_jax.training.remat_candidates import AUTO_REMAT_ORDER, RematCandidate
from longrm_jax.training.params import ParamCodec
from longrm_jax.training.telemetry import LoraFlops, step_flops

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=8, family="qwen3", qk_norm=True, head="classifier", pad_token_id=0, attention_impl="xla")


def _loss_and_grads(cfg: ModelConfig, values: dict, ids, seg):
    codec = ParamCodec(build_model(cfg))

    def loss(v):
        scores = codec.model(v).token_scores(ids, None, seg)
        return jnp.sum(jnp.sin(scores))  # every token's output matters

    return jax.jit(jax.value_and_grad(loss))(values)


@pytest.mark.parametrize("remat", ["none", "offload_layer_inputs"])
def test_tiled_mlp_gives_the_untiled_loss_and_gradients(remat):
    """Chunks of 8 tokens over rows of 37 (a padded last chunk), under each remat policy: the same loss and
    gradients of every weight as the whole-row MLP (fp32)."""
    cfg = ModelConfig(**TINY, remat=remat)
    values = ParamCodec(build_model(cfg)).values(build_model(cfg))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, 64, (2, 37)), jnp.int32)
    seg = jnp.asarray(np.repeat([[1] * 20 + [2] * 17], 2, 0), jnp.int32)
    want_loss, want = _loss_and_grads(cfg, values, ids, seg)
    got_loss, got = _loss_and_grads(cfg.replace(mlp_chunk_tokens=8), values, ids, seg)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    assert set(got) == set(want)
    for k in want:
        # fp32 sums in another order: an element's error scales with the array's largest terms, not with the
        # element (an embedding gradient of 7.9e-3 beside ones of 3.8 was off by 1.5e-6 on one CPU model)
        scale = max(1.0, float(np.abs(want[k]).max()))
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6 * scale, err_msg=k)


def test_tiled_mlp_keeps_one_chunk_of_intermediates():
    """What tiling is for: the compiled backward's temporaries shrink with the chunk (rows of 512 tokens,
    intermediate 8192: [512, 8192] fp32 buffers are 16 MiB each, the attention scores 4 MiB)."""
    cfg = ModelConfig(**(TINY | dict(intermediate_size=8192, num_layers=1)), remat="full")
    values = ParamCodec(build_model(cfg)).values(build_model(cfg))
    ids = jnp.ones((1, 512), jnp.int32)

    def temp(c):
        codec = ParamCodec(build_model(c))
        f = jax.grad(lambda v: codec.model(v).token_scores(ids).sum())
        return jax.jit(f).lower(values).compile().memory_analysis().temp_size_in_bytes

    assert temp(cfg.replace(mlp_chunk_tokens=64)) < 0.5 * temp(cfg)


def test_lora_branches_equal_the_merged_weights():
    """The train step's LoRA (x @ W + (x @ A) @ (scale B) in each layer, the base never merged) gives the merged
    model's outputs and the same adapter gradients; the frozen base gets none."""
    cfg = ModelConfig(**TINY, remat="full")
    model = build_model(cfg)
    codec = ParamCodec(model)
    values = codec.values(model)
    targets = lora.select_targets(values, ["all-linear", "score"])
    names = {k: codec.logical_names(k) for k in targets}
    adapters = lora.init_adapters({k: values[k].shape for k in targets}, names, targets, 4, jax.random.key(1))
    rng = np.random.default_rng(1)
    adapters = {k: (jnp.asarray(rng.normal(size=v.shape) * 0.1, jnp.float32) if k.endswith("lora_b") else v)
                for k, v in adapters.items()}
    ids = jnp.asarray(rng.integers(1, 64, (2, 24)), jnp.int32)

    def merged(ad):
        return codec.model(lora.effective_params(ad, values, alpha=8, rank=4)).token_scores(ids).sum()

    def branched(ad):
        weights, branches = lora.split_layer_branches(ad, values, alpha=8, rank=4)
        assert set(branches) == {n + s for n in lora.ALL_LINEAR for s in ("/lora_a", "/lora_b")}
        assert "score/lora_a" not in weights and "score" in weights  # the head's adapter is merged (tiny)
        m = codec.model(weights)
        m.model.layers.attach_lora_branches(branches)
        return m.token_scores(ids).sum()

    want, want_g = jax.jit(jax.value_and_grad(merged))(adapters)
    got, got_g = jax.jit(jax.value_and_grad(branched))(adapters)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for k in want_g:
        np.testing.assert_allclose(got_g[k], want_g[k], rtol=1e-4, atol=1e-5 * np.abs(want_g[k]).max(), err_msg=k)
    # The gradient program has no stacked [layers, in, out] gradient of a base weight: its temporaries are
    # smaller than the merged program's.
    temp = {f: jax.jit(jax.grad(f)).lower(adapters).compile().memory_analysis().temp_size_in_bytes
            for f in (merged, branched)}
    assert temp[branched] < temp[merged]


def test_lora_base_dtype_keeps_the_frozen_base_in_bf16():
    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.training.config import ConfigError, load_config
    from longrm_jax.training.model_setup import init_random, preset_config, with_training_numerics
    from longrm_jax.training.state import abstract_state, make_optimizer

    tiny = ["model.init=null", "model.preset=tiny_llama", "model.overrides={vocab_size: 256}",
            "lora.base_dtype=bfloat16", "mesh.seq=1"]
    cfg = load_config("configs/llama31_8b_disrm_bt.yaml", tiny)
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    codec, _ = init_random(with_training_numerics(preset_config(cfg), cfg), mesh, 0)
    state, _ = abstract_state(cfg, codec, make_optimizer(cfg.optim, 10), mesh, jax.random.key(0))
    assert {v.dtype for v in state.frozen.values()} == {jnp.dtype(jnp.bfloat16)}
    assert {v.dtype for v in state.params.values()} == {jnp.dtype(jnp.float32)}  # adapters stay fp32
    with pytest.raises(ConfigError, match="lora.base_dtype must be"):
        load_config("configs/llama31_8b_disrm_bt.yaml", tiny + ["lora.base_dtype=float16"])


def test_lora_flops_count_no_weight_gradients_for_the_frozen_base():
    """docs/flops.md: a LoRA step is 4 FLOPs per frozen weight and token (forward, activation gradients), 6 per
    adapter parameter; attention unchanged. Llama-3.1-8B, 2 x 64K rows, rank-8 adapters on all linear layers
    and the (frozen) score head, by hand."""
    from longrm_jax.training.model_setup import PRESETS

    mcfg = ModelConfig(**(PRESETS["llama31_8b"] | {"head": "classifier"}))
    seg = np.ones((2, 65536), np.int32)
    d, f, L = 4096, 14336, 32
    body = L * (2 * d * 4096 + 2 * d * 1024 + 3 * d * f)
    adapters = L * 8 * ((d + 4096) * 2 + (d + 1024) * 2 + 2 * (d + f) + (f + d)) + 8 * (d + 1)
    attention = 6 * L * 32 * 128 * 2 * 65536**2
    tokens = 2 * 65536
    full = step_flops(mcfg, "classifier", seg)
    assert full == pytest.approx(6 * body * tokens + 6 * d * tokens + attention)
    counts = LoraFlops(adapters, head_trained=False)
    assert step_flops(mcfg, "classifier", seg, lora=counts) == pytest.approx(
        4 * body * tokens + 6 * adapters * tokens + 4 * d * tokens + attention)
    # At 2 x 64K the old count (6 N) overstated this step's work by 17%.
    assert full / step_flops(mcfg, "classifier", seg, lora=counts) == pytest.approx(1.174, abs=0.001)
    # Counted from the trainable parameters of the shipped DisRM config (adapters only: the head is frozen).
    trainable = {"model/layers/q_proj/lora_a": np.zeros((L, d, 8)),
                 "model/layers/q_proj/lora_b": np.zeros((L, 8, 4096)),
                 "score/lora_a": np.zeros((d, 8)), "score/lora_b": np.zeros((8, 1))}
    assert LoraFlops.of(trainable) == LoraFlops(L * 8 * (d + 4096) + 8 * (d + 1), False)
    assert LoraFlops.of({"score": np.zeros((d, 1))}).head_trained


# Device / pinned-host GiB per auto candidate of a step where only the tiled MLP with offloading fits.
ONLY_TILED = {"none": (300.0, 0), "save_attention_out": (200.0, 0), "save_attention_out+tiled_mlp": (180.0, 0),
              "full": (120.0, 0), "full+tiled_mlp": (90.0, 0),
              "offload_layer_inputs_and_attention": (85.0, 80.0), "offload_layer_inputs": (80.0, 64.0),
              "offload_layer_inputs+tiled_mlp": (60.0, 64.0)}


def _fake(figures):
    from longrm_jax.training.memory_plan import ProgramMemory

    def compile_for(candidate):
        device, host = figures[candidate.name]
        return candidate, [ProgramMemory("gradients", 0, 0, 0, 0, int(device * GiB), int(host * GiB))]

    return compile_for


def test_memory_plan_picks_the_tiled_mlp_when_nothing_else_fits():
    chosen, _, _, tried = choose(_fake(ONLY_TILED), AUTO_REMAT_ORDER, int(75 * GiB), int(96 * GiB))
    assert chosen.name == "offload_layer_inputs+tiled_mlp" and len(tried) == len(AUTO_REMAT_ORDER)
    assert (chosen.policy, chosen.mlp_chunk_tokens(0)) == ("offload_layer_inputs", 8192)
    full, tiled = RematCandidate.parse("full"), RematCandidate.parse("full+tiled_mlp")
    assert (full.policy, full.mlp_chunk_tokens(0)) == ("full", 0) and tiled.mlp_chunk_tokens(4096) == 4096
    # Tiling on the device comes before any offloading.
    assert choose(_fake(ONLY_TILED), AUTO_REMAT_ORDER, int(95 * GiB), int(96 * GiB))[0].name == "full+tiled_mlp"
    with pytest.raises(MemoryPlanError, match="model.mlp_chunk_tokens=8192"):
        choose(_fake(ONLY_TILED), AUTO_REMAT_ORDER, int(50 * GiB), int(96 * GiB))


@pytest.mark.slow
def test_offloaded_optimizer_state_trains_the_same_steps(tmp_path):
    """optim.offload_state: the AdamW moments live in pinned host memory between steps (the CPU backend has a
    pinned_host memory space, so the placement and the transfers run here too) and the run's parameters after
    two steps equal the on-device run's; the plan counts the moments as host memory, not device memory."""
    import json

    from longrm_jax.training import loop
    from longrm_jax.training.config import load_config

    tiny = ["stage=bt", "lora.rank=0", "data.seq_len=128", "data.batch_rows=2", "model.overrides={num_layers: 2}",
            "data.synthetic.lengths=[50,60]", "data.num_train=8", "steps=2", "log_every=1", "tensorboard=false",
            "progress=false", "checkpoint.every=0", "checkpoint.at_end=false", "eval_before=false",
            "eval_after=false", "mesh.fsdp=1"]
    runs = {}
    for offload in (False, True):
        out = tmp_path / str(offload)
        cfg = load_config(None, tiny + [f"output_dir={out}", f"optim.offload_state={str(offload).lower()}"])
        result = loop.run(cfg)
        kinds = {x.sharding.memory_kind for x in jax.tree.leaves(result.state.opt_state)}
        assert kinds == ({"pinned_host"} if offload else {"device"})
        assert {x.sharding.memory_kind for x in jax.tree.leaves(result.state.params)} == {"device"}
        runs[offload] = (jax.device_get(result.state.params), json.loads((out / "memory_plan.json").read_text()))
    (want, plan_dev), (got, plan_host) = runs[False], runs[True]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    moments = 2 * sum(v.size * 4 for v in want.values())
    dev, host = plan_dev["programs"][0], plan_host["programs"][0]
    assert dev["resident"] - host["resident"] >= moments
    assert plan_host["predicted_host_gib"] * GiB >= moments


def test_bench_train_peer_says_when_it_does_not_train_the_same_parameters(monkeypatch):
    """scripts/bench_train.py: without peft the PyTorch peer of a LoRA run trains every weight, and its row says
    that this is not the same work (and its FLOPs are counted as full training)."""
    import sys

    import bench_train
    from longrm_jax.training.config import load_config

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft -> ImportError
    net = object()
    lora_cfg = load_config("configs/llama31_8b_disrm_bt.yaml", []).lora
    same, label, flops = bench_train._peft_lora(net, lora_cfg)
    assert same is net and flops is None and "not the same work" in label
