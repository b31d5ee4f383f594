"""``data.layout: rows`` (one sequence per row, attention without segment ids) trains exactly like the packed
layout on the same pairs: equal loss, gradient norm and updated parameters, on one device and on 8 fake devices
(data x fsdp x seq with ring attention); and the loop runs end to end with it."""

import jax
import numpy as np
import pytest

from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training import batches as batch_lib
from longrm_jax.training import loop
from longrm_jax.training.config import ConfigError, load_config
from helpers.batches import train_batches
from longrm_jax.training.data_source import load_tokenizer
from longrm_jax.training.model_setup import init_random, preset_config, with_training_numerics
from longrm_jax.training.state import create_state, lr_schedule, make_optimizer
from longrm_jax.training.steps import StageSpec, jit_train_step, make_train_step

BASE = ["data.layout=rows", "data.seq_len=64", "data.synthetic.lengths=[24,40]",
        "data.num_train=8", "optim.lr=1e-2", "optim.warmup_ratio=0", "optim.eps=1e-3"]
CASES = {
    # 4 groups per step: data.batch_rows counts model rows, 1 + R per group in the rows layout.
    "simpo": ["stage=simpo", "loss.label_smoothing=0.1", "data.batch_rows=8"],
    "bt": ["stage=bt", "data.num_rejects=2", "data.batch_rows=12"],
}


def _compact(slotted: dict, k: int) -> dict:
    """The same groups in the packed layout: each row's samples back to back (padding after the last)."""
    out = {key: np.zeros_like(v) for key, v in slotted.items()}
    out["num_groups"] = slotted["num_groups"].copy()
    for b in range(slotted["input_ids"].shape[0]):
        keep = np.nonzero(slotted["segment_ids"][b] > 0)[0]
        for key in ("input_ids", "positions", "segment_ids", "loss_mask"):
            out[key][b, :len(keep)] = slotted[key][b, keep]
    return out


def _one_step(cfg, mesh, host, slots):
    tok = load_tokenizer(cfg.data)
    mcfg = with_training_numerics(preset_config(cfg, tok), cfg)
    codec, values = init_random(mcfg, mesh, cfg.seed)
    tx = make_optimizer(cfg.optim, 10)
    state, sh = create_state(cfg, codec, values, tx, mesh, jax.random.key(1))
    spec = StageSpec(cfg.stage, cfg.data.num_rejects, 1, slotted=slots is not None)
    step = jit_train_step(make_train_step(cfg, codec, tx, spec, lr_schedule(cfg.optim, 10)), sh,
                          batch_lib.batch_shardings(mesh, slotted=slots is not None))
    with jax.set_mesh(mesh):
        batch = batch_lib.to_global(batch_lib.prepare(host, seq_shards=mesh.shape["seq"], slots=slots), mesh)
        state, metrics = step(state, batch)
    return jax.device_get(metrics), jax.device_get(state.params)


def _host_batch(cfg):
    host = dict(train_batches(cfg, load_tokenizer(cfg.data))[0])
    k = 1 + cfg.data.num_rejects
    assert host["input_ids"].shape == (4, k * 64)
    # Sample r of each group starts at slot r; random tokens so that chosen and rejected differ a lot.
    assert (host["positions"][:, ::64] == 0).all() and (host["segment_ids"][:, ::64] == np.arange(1, k + 1)).all()
    rng = np.random.default_rng(0)
    host["input_ids"] = np.where(host["segment_ids"] > 0, rng.integers(10, 600, host["input_ids"].shape),
                                 host["input_ids"]).astype(np.int32)
    return host, k


def _assert_same(a, b):
    (m1, p1), (m2, p2) = a, b
    assert np.isfinite(m1["loss"]) and m1["loss"] > 0
    for key in ("loss", "accuracy", "chosen_reward", "rejected_reward"):
        np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(m2["grad_norm"], m1["grad_norm"], rtol=1e-4)
    assert m2["tokens"] == m1["tokens"]
    for key in p1:
        np.testing.assert_allclose(p2[key], p1[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("stage", sorted(CASES))
def test_rows_layout_matches_packed_on_one_device(stage):
    cfg = load_config(None, BASE + CASES[stage], base=DEFAULT_CONFIG)
    host, k = _host_batch(cfg)
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    packed_cfg = load_config(None, BASE + CASES[stage] + ["data.layout=packed"], base=DEFAULT_CONFIG)
    _assert_same(_one_step(packed_cfg, mesh, _compact(host, k), None), _one_step(cfg, mesh, host, k))


@pytest.mark.slow  # compiling the 8-device SPMD step dominates
def test_rows_layout_sharded_matches_single_device():
    assert len(jax.devices()) == 8
    # 2 microbatches equal one pass (either reduction: tests/test_training_reduction.py checks upstream's too)
    cfg = load_config(None, BASE + CASES["bt"] + ["grad_accum=2", "data.batch_rows=6",
                                                  "loss.reduction=global_tokens"], base=DEFAULT_CONFIG)
    host, k = _host_batch(cfg)
    single = load_config(None, BASE + CASES["bt"] + ["loss.reduction=global_tokens"], base=DEFAULT_CONFIG)
    one = _one_step(single, make_mesh(1, 1, 1, 1, devices=jax.devices()[:1]), host, k)
    _assert_same(one, _one_step(cfg, make_mesh(data=2, fsdp=2, seq=2, tensor=1), host, k))


def test_rows_layout_runs_in_the_loop(tmp_path):
    cfg = load_config(None, [
        # seq_len 128: at 32 every sequence was cut to the shared prompt (chosen == rejected, no gradient).
        f"output_dir={tmp_path}", "steps=3", "data.layout=rows", "data.seq_len=128", "data.batch_rows=4",
        "data.synthetic.lengths=[8,16]", "data.num_train=16", "data.num_eval=8", "checkpoint.every=0",
        "tensorboard=false", "progress=false", "log_every=1",
    ], base=DEFAULT_CONFIG)
    result = loop.run(cfg)
    assert result.final_step == 3 and np.isfinite(result.last_metrics["loss"])
    assert result.accuracy_after is not None


def test_rows_layout_rejects_sft():
    with pytest.raises(ConfigError, match="preference stages"):
        load_config(None, ["stage=sft", "data.layout=rows"], base=DEFAULT_CONFIG)
