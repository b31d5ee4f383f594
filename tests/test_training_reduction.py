"""``loss.reduction``: ``upstream`` (SimPO: mean over each row's pairs, then over the step's non-empty rows; SFT:
mean over the step's samples of per-sample token means) and
``global_tokens`` (one mean over the global batch), each checked against a hand-computed reduction of per-item
losses on a packed batch with accumulation 2 (loss value and gradient)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax import losses
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.train import DEFAULT_CONFIG
from longrm_jax.training import batches as batch_lib
from longrm_jax.training.config import load_config
from helpers.batches import train_batches
from longrm_jax.training.data_source import load_tokenizer
from longrm_jax.training.model_setup import init_random, preset_config, with_training_numerics
from longrm_jax.training.state import TrainState, lr_schedule, make_optimizer
from longrm_jax.training.steps import StageSpec, group_values, make_train_step, token_logprobs

# Rows of 512 tokens holding 2 to 6 items of different lengths: microbatches of unequal item counts.
BASE = ["data.seq_len=512", "data.batch_rows=2", "grad_accum=2", "data.synthetic.lengths=[2,60]",
        "data.num_train=10", "data.shuffle=false", "model.overrides.num_layers=1"]


def _setup(stage, reduction):
    cfg = load_config(None, BASE + [f"stage={stage}", f"loss.reduction={reduction}"], base=DEFAULT_CONFIG)
    mesh = make_mesh(1, 1, 1, 1, devices=jax.devices()[:1])
    tok = load_tokenizer(cfg.data)
    codec, values = init_random(with_training_numerics(preset_config(cfg, tok), cfg), mesh, 0)
    host = train_batches(cfg, tok)[0]
    groups = host["num_groups"]
    assert len(set(groups.tolist())) > 1  # unequal items per row
    spec = StageSpec(stage, 0 if stage == "sft" else 1, int(groups.max()))
    batch = jax.tree.map(jnp.asarray, batch_lib.prepare(host))
    return cfg, codec, values, batch, spec


def _per_item_losses(cfg, codec, spec, params, batch):
    """[B, G] loss of each item (SimPO pair, or SFT sample's token-mean NLL) and [B, G] validity."""
    model = codec.model(params)
    if spec.stage == "sft":
        lp = token_logprobs(model, batch, cfg.loss.chunk_tokens)
        mean, counts = losses.segment_mean_logprobs(lp, batch["target_mask"], batch["segment_ids"],
                                                    spec.num_segments)
        valid = jnp.arange(spec.max_groups)[None] < batch["num_groups"][:, None]
        return -mean, valid, (lp, counts)
    chosen, rejected, valid = group_values(model, batch, spec, cfg.loss.chunk_tokens)
    lc = cfg.loss
    per = losses.simpo_loss(chosen, rejected, beta=lc.beta, gamma=lc.gamma, label_smoothing=lc.label_smoothing,
                            nll_weight=lc.nll_weight)
    return per, valid, None


def _hand_upstream(cfg, codec, spec, params, batch):
    per, valid, _ = _per_item_losses(cfg, codec, spec, params, batch)
    if spec.stage == "sft":  # upstream trains one sample per micro step: every sample of the step weighs alike
        w = valid.astype(jnp.float32)
        return (per * w).sum() / w.sum()
    means = []
    for row in np.flatnonzero(np.asarray(batch["num_groups"]) > 0):  # a row is upstream's bucket, whichever
        w = valid[row].astype(jnp.float32)                            # micro step runs it
        means.append((per[row] * w).sum() / w.sum())
    return sum(means) / len(means)


def _hand_global(cfg, codec, spec, params, batch):
    per, valid, extra = _per_item_losses(cfg, codec, spec, params, batch)
    if spec.stage == "sft":  # every trained token weighs the same
        lp, _ = extra
        return -(lp * batch["target_mask"]).sum() / batch["target_mask"].sum()
    w = valid.astype(jnp.float32)
    return (per * w).sum() / w.sum()


@pytest.mark.parametrize("stage", ["simpo", "sft"])
# global_tokens is also covered by the accumulation / sharding equality tests; its hand check is the slow half.
@pytest.mark.parametrize("reduction", ["upstream", pytest.param("global_tokens", marks=pytest.mark.slow)])
def test_reduction_matches_hand_computation(stage, reduction):
    cfg, codec, values, batch, spec = _setup(stage, reduction)
    step = make_train_step(cfg, codec, make_optimizer(cfg.optim, 10), spec, lr_schedule(cfg.optim, 10))
    state = TrainState(jnp.zeros((), jnp.int32), values, {}, None)
    grads, aux = jax.jit(step.gradients)(state, batch)
    hand = _hand_upstream if reduction == "upstream" else _hand_global
    expected, expected_grads = jax.jit(jax.value_and_grad(lambda p: hand(cfg, codec, spec, p, batch)))(values)
    np.testing.assert_allclose(aux["objective"], expected, rtol=2e-5)
    for k in values:
        np.testing.assert_allclose(grads[k], expected_grads[k], rtol=2e-4, atol=1e-7, err_msg=k)
    if stage == "sft":  # the synthetic SFT responses are of one length here: the two reductions coincide (the
        return          # packed-SFT weighting is checked on unequal samples in tests/test_training_reference.py)
    # the two reductions really differ on this batch (unequal microbatches)
    other = _hand_global if reduction == "upstream" else _hand_upstream
    assert abs(float(other(cfg, codec, spec, values, batch)) - float(expected)) > 1e-4


@pytest.mark.parametrize("reduction", ["upstream", "global_tokens"])
def test_reduction_does_not_depend_on_the_micro_step_split(reduction):
    """The step's rows as 2 micro steps of 2 rows or as one of 4: the same loss and gradients, so ``mesh: auto``
    may re-split a step's rows over data-parallel devices (parallel.mesh_choice) without changing training."""
    cfg, codec, values, batch, spec = _setup("simpo", reduction)
    one = load_config(None, BASE + ["stage=simpo", f"loss.reduction={reduction}", "data.batch_rows=4",
                                    "grad_accum=1"], base=DEFAULT_CONFIG)
    state = TrainState(jnp.zeros((), jnp.int32), values, {}, None)
    out = []
    for c in (cfg, one):
        step = make_train_step(c, codec, make_optimizer(c.optim, 10), spec, lr_schedule(c.optim, 10))
        out.append(jax.jit(step.gradients)(state, batch))
    (g2, aux2), (g1, aux1) = out
    np.testing.assert_allclose(aux2["objective"], aux1["objective"], rtol=1e-6)
    for k in values:
        np.testing.assert_allclose(g2[k], g1[k], rtol=2e-4, atol=1e-6, err_msg=k)  # fp32 sum order


def test_simpo_hinge_loss():
    chosen, rejected = jnp.array([-1.0, -2.0, -0.5]), jnp.array([-1.5, -1.0, -3.0])
    z = 2.5 * (chosen - rejected) - 0.5
    got = losses.simpo_loss(chosen, rejected, beta=2.5, gamma=0.5, loss_type="hinge")
    np.testing.assert_allclose(got, np.maximum(0.0, 1.0 - np.asarray(z)), rtol=1e-6)
    with pytest.raises(ValueError, match="sigmoid' or 'hinge"):
        losses.simpo_loss(chosen, rejected, beta=1.0, gamma=0.0, loss_type="squared")
