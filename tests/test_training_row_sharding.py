"""Data parallelism without a sequence axis (mesh data x fsdp = 2 x 4): each device computes the LM head of its
own rows only. Over a sequence axis each device runs the chunk loops of its own tokens too (the LM head's and the
tiled MLP's), their weights gathered once. The step equals the one-device step (loss, gradient norm, updated
parameters), and the compiled program moves no per-token array between devices (before, the chunked log-prob loop
gathered every row's hidden states onto every device: issue 40's lost data-parallel time)."""

import re

import jax
import numpy as np
import pytest

from helpers.batches import train_batches
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training import batches as batch_lib
from longrm_jax.training.config import load_config
from longrm_jax.training.data_source import load_tokenizer
from longrm_jax.training.model_setup import init_random, preset_config, with_training_numerics
from longrm_jax.training.state import create_state, lr_schedule, make_optimizer
from longrm_jax.training.steps import StageSpec, jit_train_step, make_train_step

SEQ_LEN = 256  # no weight of the tiny model has a dimension of this size
COLLECTIVE = re.compile(r"= \(?([^=]*?)\)? (all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                        r"(?:-start)?\(")


def _step(cfg, mesh, host):
    tok = load_tokenizer(cfg.data)
    codec, values = init_random(with_training_numerics(preset_config(cfg, tok), cfg), mesh, cfg.seed)
    tx = make_optimizer(cfg.optim, 10)
    state, sh = create_state(cfg, codec, values, tx, mesh, jax.random.key(1))
    spec = StageSpec(cfg.stage, 0 if cfg.stage == "sft" else 1, max(int(np.max(host["num_groups"])), 1))
    step = jit_train_step(make_train_step(cfg, codec, tx, spec, lr_schedule(cfg.optim, 10)), sh,
                          batch_lib.batch_shardings(mesh))
    with jax.set_mesh(mesh):
        batch = batch_lib.to_global(batch_lib.prepare(host, seq_shards=mesh.shape["seq"]), mesh)
        hlo = step.gradients.lower(state, batch).compile().as_text()
        state, metrics = step(state, batch)
    return jax.device_get(metrics), jax.device_get(state.params), hlo


@pytest.mark.slow  # compiling the 8-device step dominates (~30 s on 2 busy cores)
@pytest.mark.parametrize("stage", ["simpo", "sft"])
def test_rows_stay_on_their_device(stage):
    assert len(jax.devices()) == 8
    overrides = [f"stage={stage}", f"data.seq_len={SEQ_LEN}", "data.batch_rows=8", "data.synthetic.lengths=[24,40]",
                 "data.num_train=16", "optim.lr=1e-2", "optim.warmup_ratio=0", "optim.eps=1e-3"]
    cfg = load_config(None, overrides, base=DEFAULT_CONFIG)
    host = dict(train_batches(cfg, load_tokenizer(cfg.data))[0])
    rng = np.random.default_rng(0)  # random tokens: synthetic pairs differ in one token (near-cancelling grads)
    host["input_ids"] = np.where(host["segment_ids"] > 0, rng.integers(10, 600, host["input_ids"].shape),
                                 host["input_ids"]).astype(np.int32)
    m1, p1, _ = _step(cfg, make_mesh(1, 1, 1, 1, devices=jax.devices()[:1]), host)
    m8, p8, hlo = _step(cfg, make_mesh(data=2, fsdp=4, seq=1, tensor=1), host)

    per_token = [(shape, op) for shape, op in COLLECTIVE.findall(hlo)
                 if any(int(d) == SEQ_LEN for d in re.findall(r"\d+", " ".join(re.findall(r"\[([\d,]*)\]", shape))))]
    assert not per_token, f"collectives of per-token arrays in the data-parallel step: {per_token}"
    assert np.isfinite(m1["loss"]) and m1["loss"] > 0
    np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
    np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=1e-4)
    for k in p1:
        np.testing.assert_allclose(p8[k], p1[k], rtol=1e-5, atol=1e-6, err_msg=k)


WHILE_BODY = re.compile(r"\bwhile\([^\n]*?body=%?([\w.\-]+)")


def _computations(hlo: str) -> dict[str, str]:
    """Every computation of the compiled module's text by name (computations start at column 0)."""
    named = ((re.match(r"(?:ENTRY )?%([\w.\-]+) ", c), c) for c in re.split(r"\n(?=\S)", hlo))
    return {m.group(1): c for m, c in named if m}


def _loop_bodies(hlo: str) -> list[str]:
    """The text of every computation that a ``while`` of the compiled module runs as its body."""
    comps = _computations(hlo)
    return [comps[name] for name in set(WHILE_BODY.findall(hlo)) if name in comps]


def _nested_loop_bodies(hlo: str) -> list[str]:
    """The bodies of the loops that run inside another loop's body (e.g. chunk loops inside the layers' loop),
    following the computations a body calls (fusions, calls, conditionals, loops)."""
    comps = _computations(hlo)
    todo = [name for name in set(WHILE_BODY.findall(hlo)) if name in comps]
    seen, inner = set(todo), set()
    while todo:
        text = comps[todo.pop()]
        inner.update(name for name in WHILE_BODY.findall(text) if name in comps)
        for callee in re.findall(r"%([\w.\-]+)", text):
            if callee in comps and callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return [comps[name] for name in inner]


@pytest.mark.slow  # compiling the 8-device step (~40 s on 2 busy cores)
def test_over_a_seq_axis_the_head_and_the_tiled_mlp_gather_their_weights_once_not_per_chunk():
    """Over data x fsdp x seq = 2 x 2 x 2 with several LM-head chunks and MLP chunks per device: the step equals
    one device's. No loop of the compiled gradient program moves an array with the vocabulary's dimension (the
    head's weights or their gradient), and no loop inside the layers' loop one with the MLP's (its weights or
    their gradients): each device runs the chunks of its own tokens against weights gathered once (the head per
    step, the MLP per layer). Before, XLA gathered the weights and reduced their fp32 gradients in every chunk."""
    overrides = ["stage=sft", f"data.seq_len={SEQ_LEN}", "data.batch_rows=4", "data.synthetic.lengths=[24,40]",
                 "data.num_train=8", "loss.chunk_tokens=64", "model.mlp_chunk_tokens=32", "model.remat=full",
                 "optim.lr=1e-2", "optim.warmup_ratio=0", "optim.eps=1e-3"]
    cfg = load_config(None, overrides, base=DEFAULT_CONFIG)
    tok = load_tokenizer(cfg.data)
    mcfg = preset_config(cfg, tok)
    host = dict(train_batches(cfg, tok)[0])
    m1, p1, _ = _step(cfg, make_mesh(1, 1, 1, 1, devices=jax.devices()[:1]), host)
    m8, p8, hlo = _step(cfg, make_mesh(data=2, fsdp=2, seq=2, tensor=1), host)

    def moved_in(bodies, size):
        return [(shape, op) for body in bodies for shape, op in COLLECTIVE.findall(body)
                if str(size) in re.findall(r"\d+", shape)]

    head_in_loops = moved_in(_loop_bodies(hlo), mcfg.vocab_size)
    assert not head_in_loops, f"collectives of vocabulary-sized arrays inside a loop: {head_in_loops}"
    mlp_in_chunk_loops = moved_in(_nested_loop_bodies(hlo), mcfg.intermediate_size)
    assert not mlp_in_chunk_loops, f"collectives of MLP-sized arrays inside a chunk loop: {mlp_in_chunk_loops}"
    np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
    for k in p1:
        np.testing.assert_allclose(p8[k], p1[k], rtol=1e-5, atol=1e-6, err_msg=k)
