"""Pairs longer than a row: each sequence is cut on its own (prompt middle), never the pair as a whole, so every
pair still trains, and the packed layout (a row of its own for such a pair) gives the same per-pair losses as the
rows layout (one sequence per row)."""

import jax
import numpy as np
import pytest

from longrm_jax import losses
from longrm_jax.data.packing import unpack_row
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training import batches as batch_lib
from longrm_jax.training.config import load_config
from conftest import needs_upstream_rows
from helpers.batches import train_batches
from longrm_jax.training.data_source import load_tokenizer, slots, train_records
from longrm_jax.training.model_setup import init_random, preset_config, with_training_numerics
from longrm_jax.training.steps import StageSpec, make_eval_step

# Synthetic haystacks of 90 to 150 words: every sequence is longer than the 64-token row.
BASE = ["stage=simpo", "data.seq_len=64", "data.batch_rows=2", "data.synthetic.lengths=[90,150]",
        "data.num_train=6", "data.shuffle=false"]


def _per_pair_losses(cfg, values, codec, mesh) -> dict:
    """{chosen token ids: SimPO loss} for every pair of the run's (one-epoch, in-memory) batches."""
    tok = load_tokenizer(cfg.data)
    k = slots(cfg)
    spec = StageSpec("simpo", 1, 1 if k else 4, slotted=k is not None)
    evaluate = make_eval_step(cfg, codec, spec)
    out = {}
    for host in train_batches(cfg, tok):
        batch = batch_lib.to_global(batch_lib.prepare(host, slots=k), mesh)
        with jax.set_mesh(mesh):
            chosen, rejected, valid = jax.device_get(evaluate(values, {}, batch))
        per = np.asarray(losses.simpo_loss(chosen, rejected, beta=cfg.loss.beta, gamma=cfg.loss.gamma))
        for r in range(host["input_ids"].shape[0]):
            segs = unpack_row(host, r)
            for g in range(int(host["num_groups"][r])):
                (c_ids, c_mask), (r_ids, r_mask) = segs[2 * g], segs[2 * g + 1]
                assert len(c_ids) <= cfg.data.seq_len and len(r_ids) <= cfg.data.seq_len  # each cut on its own
                assert c_mask.sum() > 1 and r_mask.sum() > 1 and not np.array_equal(c_ids, r_ids)
                assert valid[r, g]
                out[tuple(c_ids.tolist())] = float(per[r, g])
    return out


@pytest.fixture(scope="module")
def model():
    cfg = load_config(None, BASE, base=DEFAULT_CONFIG)
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    codec, values = init_random(with_training_numerics(preset_config(cfg, load_tokenizer(cfg.data)), cfg), mesh, 0)
    return codec, values, mesh


def test_packed_and_rows_layouts_give_the_same_per_pair_losses(model):
    codec, values, mesh = model
    packed = load_config(None, BASE, base=DEFAULT_CONFIG)
    rows = load_config(None, BASE + ["data.layout=rows"], base=DEFAULT_CONFIG)
    assert len(train_records(packed)) == 6
    a = _per_pair_losses(packed, values, codec, mesh)
    b = _per_pair_losses(rows, values, codec, mesh)
    assert len(a) == 6 and a.keys() == b.keys()  # no pair lost or merged
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6)
    assert len({round(v, 6) for v in a.values()}) == 6  # no constant (destroyed) pair


def test_every_long_pair_trains_a_nonzero_gradient(model):
    """Per pair: the gradient of its loss is non-zero (the old whole-pair cut made equal prefixes: zero)."""
    codec, values, mesh = model
    cfg = load_config(None, BASE, base=DEFAULT_CONFIG)
    spec = StageSpec("simpo", 1, 4)
    from longrm_jax.training.steps import group_values

    def pair_loss(params, batch, r, g):
        chosen, rejected, _ = group_values(codec.model(params), batch, spec, cfg.loss.chunk_tokens)
        return losses.simpo_loss(chosen, rejected, beta=2.5, gamma=0.5)[r, g]

    grad = jax.jit(jax.grad(pair_loss))
    seen = 0
    for host in train_batches(cfg, load_tokenizer(cfg.data)):
        batch = batch_lib.to_global(batch_lib.prepare(host), mesh)
        for r in range(host["input_ids"].shape[0]):
            for g in range(int(host["num_groups"][r])):
                with jax.set_mesh(mesh):
                    norm = float(jax.device_get(jax.tree.reduce(
                        lambda acc, x: acc + (x.astype(np.float32) ** 2).sum(), grad(values, batch, r, g), 0.0)))
                assert norm > 1e-12
                seen += 1
    assert seen == 6


@pytest.mark.slow  # tokenizing 20 real rows (up to 107K tokens) and 20 gradients of 2 x 2,048-token pairs
@needs_upstream_rows
def test_real_upstream_pairs_in_2048_token_rows_all_have_nonzero_gradients(request):
    """The 20 real SimPO rows (prompts of 14K to 70K Qwen tokens) in rows of 2,048: each pair's own gradient is
    non-zero. Token ids are renumbered into a small vocabulary (order kept) so a tiny model can run them."""
    import os

    import qwen3_like_tokenizer
    from longrm_jax.data.pipeline import make_train_iterator
    from longrm_jax.data.readers import read_records
    from longrm_jax.data.tokenize import ChatTokenizer
    from longrm_jax.training.steps import group_values

    from conftest import EXECUTION_HEAVY_COMPILER_OPTIONS, UPSTREAM_DATA

    simpo = os.path.join(UPSTREAM_DATA, "SimPO_Data_Sampled20")
    out = qwen3_like_tokenizer.cached(str(request.config.cache.mkdir("qwen3_like_tokenizer_v2")))
    tok = ChatTokenizer.from_dir(out, enable_thinking=None)
    records = [r for s in ("train", "eval", "test") for r in read_records(simpo, "preference", split=s)]
    it = make_train_iterator(records, tok, stage="simpo", max_length=2048, buckets=(2048,), batch_size=1,
                             shuffle=False, num_epochs=1, prefetch=0, process_index=0, process_count=1)
    batches = list(it)
    it.close()
    vocab = np.unique(np.concatenate([b["input_ids"].ravel() for b in batches]))
    cfg = load_config(None, ["stage=simpo", "data.seq_len=2048", "model.overrides.num_layers=1",
                             f"model.overrides.vocab_size={len(vocab)}"], base=DEFAULT_CONFIG)
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    codec, values = init_random(with_training_numerics(preset_config(cfg), cfg), mesh, 0)
    spec = StageSpec("simpo", 1, 1)

    def pair_loss(params, batch):
        chosen, rejected, _ = group_values(codec.model(params), batch, spec, cfg.loss.chunk_tokens)
        return losses.simpo_loss(chosen, rejected, beta=2.5, gamma=0.5)[0, 0]

    grad = jax.jit(jax.grad(pair_loss), compiler_options=EXECUTION_HEAVY_COMPILER_OPTIONS)
    seen = 0
    for host in batches:
        if not host["num_groups"][0]:
            continue
        host = dict(host, input_ids=np.searchsorted(vocab, host["input_ids"]).astype(np.int32))
        batch = batch_lib.to_global(batch_lib.prepare(host), mesh)
        with jax.set_mesh(mesh):
            g = jax.device_get(grad(values, batch))
        assert sum(float((np.asarray(v, np.float32) ** 2).sum()) for v in g.values()) > 1e-12
        seen += 1
    assert seen == 20
