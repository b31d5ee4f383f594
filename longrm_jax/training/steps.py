"""Jitted train and eval steps for the stages ``sft``, ``simpo`` and ``bt``.

A step receives a prepared batch (see ``training.batches``): [B, T] arrays ``input_ids``, ``positions``,
``segment_ids``, ``targets`` (next token within the segment, -1 elsewhere), ``target_mask``,
``last_token_mask``, and [B] ``num_groups``; slotted batches (``StageSpec.slotted``) have [B, k, T / k] arrays,
one group of k sequences per row.

Loss reduction (``loss.reduction``):
- ``upstream`` (default): as the upstream trainer. SimPO / BT, where upstream's micro-step is one bucket (one
  packed row, run by the whole ring group; data-parallel groups then average their buckets' losses): the loss of
  a row is the mean over its pairs, and the step's loss the mean over its non-empty rows, with a row as the
  bucket. SFT, where upstream's micro-step is one sample: the mean over the step's samples of each sample's
  token-mean NLL, whatever their lengths and however they were packed into rows and microbatches (a packed row
  of 2 samples and one of 1 weigh their 3 samples alike).
- ``global_tokens``: sums over the microbatch divided by the count over the *whole* global batch (trained
  tokens for SFT, valid groups for SimPO / BT): every token (SFT) or pair weighs the same, independent of how
  the rows were packed or split into microbatches.
Both are exact under any sharding and any split of the step's rows into micro steps (``grad_accum``): the
counts are over the whole step, so ``mesh: auto`` may re-split a step's rows (``parallel.mesh_choice``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from longrm_jax import losses
from longrm_jax.parallel.placement import SEQ_AXIS, on_own_rows
from longrm_jax.training.config_schema import LossSection, TrainConfig
from longrm_jax.training.params import ParamCodec
from longrm_jax.training.lora import split_layer_branches
from longrm_jax.training.state import TrainState
from longrm_jax.xla_flags import gpu_mesh_compiler_options

METRIC_KEYS = ("loss", "chosen_reward", "rejected_reward", "accuracy", "margin")
PREFERENCE_METRICS = METRIC_KEYS[1:]  # meaningless for SFT (its step reports zeros for them)


@dataclass(frozen=True)
class StageSpec:
    """Static shape facts of a run's batches."""

    stage: str
    num_rejects: int
    max_groups: int
    slotted: bool = False  # [B, 1 + R, L] batches: one sequence per row, no segment ids (max_groups 1)

    def __post_init__(self):
        if self.slotted and (self.stage == "sft" or self.max_groups != 1):
            raise ValueError("slotted batches hold one preference group per row (stage simpo / bt, max_groups 1)")

    @property
    def num_segments(self) -> int:
        return self.max_groups * (1 + self.num_rejects)


REDUCTIONS = ("upstream", "global_tokens")


def item_count(batch: dict, spec: StageSpec) -> jax.Array:
    """Items (valid groups: pairs, or SFT samples) in a batch, at least 1."""
    return jnp.maximum(jnp.minimum(batch["num_groups"], spec.max_groups).astype(jnp.float32).sum(), 1.0)


def row_weights(batch: dict, spec: StageSpec) -> jax.Array:
    """[B] weight of each pair of each row under ``upstream``'s SimPO / BT reduction (a row is upstream's bucket):
    1 / (the row's pairs x the batch's non-empty rows); 0 for an empty row."""
    per_row = jnp.minimum(batch["num_groups"], spec.max_groups).astype(jnp.float32)
    nonempty = jnp.maximum((per_row > 0).sum().astype(jnp.float32), 1.0)
    return jnp.where(per_row > 0, 1.0 / (jnp.maximum(per_row, 1.0) * nonempty), 0.0)


def batch_count(batch: dict, spec: StageSpec, reduction: str = "global_tokens") -> jax.Array:
    """Normaliser of the summed metrics over a (global) batch: trained tokens (sft with ``global_tokens``) or
    items (valid groups / samples)."""
    if spec.stage == "sft" and reduction == "global_tokens":
        return jnp.maximum(batch["target_mask"].astype(jnp.float32).sum(), 1.0)
    return item_count(batch, spec)


def group_values(model, batch: dict, spec: StageSpec, chunk_tokens: int):
    """(chosen [B, G], rejected [B, G, R], valid [B, G]) of the stage's quantity: pi (mean response log-prob)
    for sft / simpo, the score at the segment's last token for bt. ``chunk_tokens``: ``loss.chunk_tokens``."""
    b = batch["input_ids"].shape[0]
    if spec.slotted:
        # One sequence per row: rows [B * k, L], each its own segment 1; the model sees no segment ids (right
        # padding needs no mask under a causal one, and pad tokens carry no loss).
        rows = {k: v.reshape((-1, v.shape[-1])) for k, v in batch.items() if k not in ("num_groups", "pair_weight")}
        seg, attn_seg, num_segments = (rows["segment_ids"] > 0).astype(jnp.int32), None, 1
    else:
        rows, num_segments = batch, spec.num_segments
        seg = attn_seg = batch["segment_ids"]
    if spec.stage == "bt":
        scores = model.token_scores(rows["input_ids"], rows["positions"], attn_seg)[..., 0].astype(jnp.float32)
        vals = losses.segment_last_values(scores, rows["last_token_mask"], seg, num_segments)
    else:
        lp = token_logprobs(model, rows, chunk_tokens, packed=not spec.slotted)
        vals, _ = losses.segment_mean_logprobs(lp, rows["target_mask"], seg, num_segments)
    vals = vals.reshape(b, spec.max_groups, 1 + spec.num_rejects)
    valid = jnp.arange(spec.max_groups)[None, :] < batch["num_groups"][:, None]
    return vals[..., 0], vals[..., 1:], valid


def token_logprobs(model, batch: dict, chunk_tokens: int, packed: bool = True) -> jax.Array:
    """[B, T] log-prob of each target token, the LM head's fp32 logits ``chunk_tokens`` at a time;
    ``packed=False``: one sequence per row, attention without segments."""
    seg = batch["segment_ids"] if packed else None
    hidden = model.hidden_states(batch["input_ids"], batch["positions"], seg)
    # The head in the compute dtype (bf16 matmuls on accelerators); logits accumulate in fp32 chunk by chunk.
    head = model.lm_head_weight().astype(hidden.dtype)
    # Only the trained (response) tokens' log-probs are read: the LM head skips chunks without one. Each device
    # walks its own rows' chunks: left to XLA, the loop over rows x chunks gathered every row's hidden states
    # onto every device (a data-parallel step then ran every row's LM head on every GPU). Under a ``seq`` axis
    # each device walks its own tokens too, with the head gathered once: left to XLA, every chunk of the loop
    # gathered the head's weights and reduce-scattered their fp32 gradient again (the ring's 2 x 128K SimPO
    # step over four GPUs spent 2.3 of its 25.3 s there, mostly in those collectives; docs/perf_training.md
    # "The ring's LM head"). Its chunks are then 1/seq of ``chunk_tokens``: each device's logits buffer stays
    # the size it had when the chunks spanned every shard.
    def own_tokens(hidden_btd, targets_bt, needed_bt, head_dv):
        return losses.token_logprobs(hidden_btd, head_dv, targets_bt, chunk_tokens=max(1, chunk_tokens // shards),
                                     needed_bt=needed_bt)

    shards = seq_shards()
    return on_own_rows(own_tokens, (hidden, batch["targets"], batch["target_mask"] > 0), (head,),
                       tokens_over=SEQ_AXIS)


def seq_shards() -> int:
    """How many devices the ``seq`` axis of the mesh in use splits the tokens over (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty else int(dict(mesh.shape).get(SEQ_AXIS, 1))


def loss_sums(model, batch: dict, lc: LossSection, spec: StageSpec) -> tuple[jax.Array, dict]:
    """(summed loss, summed metrics) over a microbatch. SFT sums token NLLs (``global_tokens``) or per-sample
    token means (``upstream``). SimPO / BT: a batch carrying ``pair_weight`` ([B], ``row_weights``) weighs each
    row's pairs by it in the loss (not in the metrics)."""
    if spec.stage == "sft":
        lp = token_logprobs(model, batch, lc.chunk_tokens)
        if lc.reduction == "upstream":
            mean_lp, counts = losses.segment_mean_logprobs(lp, batch["target_mask"], batch["segment_ids"],
                                                           spec.num_segments)
            nll = -(mean_lp * (counts > 0)).sum()
        else:
            nll = losses.sft_loss(lp, batch["target_mask"]).sum()
        zero = jnp.zeros((), jnp.float32)
        return nll, {"loss": nll, "chosen_reward": zero, "rejected_reward": zero, "accuracy": zero, "margin": zero}
    chosen, rejected, valid = group_values(model, batch, spec, lc.chunk_tokens)
    if spec.stage == "simpo":
        per = losses.simpo_loss(chosen, rejected, beta=lc.beta, gamma=lc.gamma,
                                label_smoothing=lc.label_smoothing, nll_weight=lc.nll_weight,
                                loss_type=lc.loss_type)
        rc, rr = lc.beta * chosen, lc.beta * rejected.mean(-1)
    else:
        per = losses.bradley_terry_loss(chosen, rejected, margin=lc.margin,
                                        center_rewards_coefficient=lc.center_rewards_coefficient)
        rc, rr = chosen, rejected.mean(-1)
    w = valid.astype(jnp.float32)
    total = (per * w * batch["pair_weight"][:, None]).sum() if "pair_weight" in batch else (per * w).sum()
    sums = {
        "loss": (per * w).sum(),
        "chosen_reward": (rc * w).sum(),
        "rejected_reward": (rr * w).sum(),
        "accuracy": ((rc > rr) * w).sum(),
        "margin": ((rc - rr) * w).sum(),
    }
    return total, sums


def step_model(codec: ParamCodec, cfg: TrainConfig, params: dict, frozen: dict):
    """The model a step runs: full fine-tuning the parameters themselves; LoRA the frozen base with the
    adapters of decoder layers as branches (``training.lora.split_layer_branches``: no merged copy of the base,
    no gradient for it) and the others (a score head's) merged."""
    weights, branches = split_layer_branches(params, frozen, alpha=cfg.lora.alpha, rank=cfg.lora.rank)
    model = codec.model(weights)
    if branches:
        model.model.layers.attach_lora_branches(branches)
    return model


def _microbatches(batch: dict, n: int) -> dict:
    """[B, ...] -> [n, B/n, ...]; row i*n + m goes to microbatch m, keeping the batch-dim sharding."""
    return jax.tree.map(lambda x: jnp.swapaxes(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 0, 1), batch)


@dataclass(frozen=True)
class TrainStep:
    """``step(state, batch) -> (state, metrics)`` as two functions, jitted as two programs by ``jit_train_step``:
    ``gradients(state, batch) -> (grads, aux)`` (forward and backward over every microbatch) and
    ``update(state, grads, aux) -> (state, metrics)`` (the optimizer).

    Why two programs: the update does not depend on the batch shape, so it compiles once for every bucket and
    groups bound; the split costs nothing measurable (Qwen3-8B, 2 x 8K tokens: gradient program 1.74 s, update
    0.03 s, both in a row 1.76 s; docs/perf_training.md, "The one-GPU Bradley-Terry step"). Calling the
    (unjitted) object runs both, e.g. inside another transformation.
    """

    gradients: Callable
    update: Callable

    def __call__(self, state: TrainState, batch: dict):
        return self.update(state, *self.gradients(state, batch))


def make_train_step(cfg: TrainConfig, codec: ParamCodec, tx, spec: StageSpec, schedule) -> TrainStep:
    """The train step (not jitted; see ``jit_train_step``).

    A non-finite loss or gradient leaves the state unchanged (the caller stops the run on it), so a NaN never
    reaches the parameters or a checkpoint.
    """
    accum = cfg.grad_accum
    reduction = cfg.loss.reduction
    if reduction not in REDUCTIONS:
        raise ValueError(f"loss.reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")

    def gradients(state: TrainState, batch: dict):
        norm = batch_count(batch, spec, reduction)
        per_row = reduction == "upstream" and spec.stage != "sft"
        if per_row:  # the mean over the step's non-empty rows of each row's pair mean: weights over the whole step
            batch = batch | {"pair_weight": row_weights(batch, spec)}

        def micro_loss(params, mb):
            model = step_model(codec, cfg, params, state.frozen)
            total, sums = loss_sums(model, mb, cfg.loss, spec)
            return (total if per_row else total / norm), sums  # global_tokens / upstream SFT: over the step

        grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
        if accum == 1:
            (objective, sums), grads = grad_fn(state.params, batch)
        else:
            def body(carry, mb):
                g_acc, s_acc, o_acc = carry
                (o, s), g = grad_fn(state.params, mb)
                return (jax.tree.map(jnp.add, g_acc, g), jax.tree.map(jnp.add, s_acc, s), o_acc + o), None

            zeros_g = jax.tree.map(jnp.zeros_like, state.params)
            zeros_s = {k: jnp.zeros((), jnp.float32) for k in METRIC_KEYS}
            (grads, sums, objective), _ = jax.lax.scan(
                body, (zeros_g, zeros_s, jnp.zeros((), jnp.float32)), _microbatches(batch, accum))
        return grads, {"sums": sums, "objective": objective, "count": norm,
                       "tokens": (batch["segment_ids"] > 0).sum()}

    offload = cfg.optim.offload_state

    def update(state: TrainState, grads, aux: dict):
        norm = aux["count"]
        grad_norm = optax.tree.norm(grads)  # what optax.global_norm (deprecated) computes
        if offload:  # optim.offload_state: the moments come in from pinned host memory for the update
            state = state.replace(opt_state=jax.device_put(state.opt_state, jax.memory.Space.Device))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        # The loss as optimised (its reduction); the other metrics are means over the batch's items.
        metrics = {k: v / norm for k, v in aux["sums"].items()} | {"loss": aux["objective"]}
        ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        new = TrainState(state.step + 1, params, state.frozen, opt_state)
        new = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, state)
        if offload:  # and go back (the jitted update's out_shardings place them in pinned host memory)
            new = new.replace(opt_state=jax.device_put(new.opt_state, jax.memory.Space.Host))
        metrics |= {"grad_norm": grad_norm, "lr": schedule(state.step), "count": norm, "tokens": aux["tokens"]}
        return new, metrics

    return TrainStep(gradients, update)


@dataclass
class JittedTrainStep:
    """``step(state, batch) -> (state, metrics)``: the gradient program, then the update program (the state
    donated to it; the gradients have no output to alias).

    ``compile(state, batch)`` compiles both ahead of time for abstract inputs (``jax.ShapeDtypeStruct`` with
    shardings) and returns the compiled step: its ``programs`` are the two executables (``training.memory_plan``
    reads their memory analysis); a batch of another shape (a shorter bucket) runs through the jitted ones."""

    gradients: Callable
    update: Callable
    programs: tuple = ()
    batch_shape: tuple | None = None
    jitted: "JittedTrainStep | None" = None

    def __call__(self, state: TrainState, batch: dict):
        if self.jitted is not None and batch["input_ids"].shape != self.batch_shape:
            return self.jitted(state, batch)
        return self.update(state, *self.gradients(state, batch))

    def compile(self, state, batch) -> "JittedTrainStep":
        grads_abs, aux_abs = jax.eval_shape(self.gradients, state, batch)
        grads_sh = gradient_shardings(jax.tree.map(lambda x: x.sharding, state))
        grads_abs = jax.tree.map(lambda g, s: jax.ShapeDtypeStruct(g.shape, g.dtype, sharding=s), grads_abs, grads_sh)
        gradients = self.gradients.lower(state, batch).compile()
        update = self.update.lower(state, grads_abs, aux_abs).compile()
        return JittedTrainStep(gradients, update, (("gradients", gradients), ("update", update)),
                               tuple(batch["input_ids"].shape), self)


def gradient_shardings(state_shardings):
    """The gradients laid out as the AdamW moments they update (``mu``'s shardings, in the parameters' memory):
    the parameters' own layout, except under ``mesh.optimizer_axes`` (ZeRO-1: weights replicated, moments
    sharded), where the gradient program then ends in a reduce-scatter instead of an all-reduce and each device
    keeps only its shard of the gradients."""
    params = state_shardings.params
    mu = optax.tree_utils.tree_get(state_shardings.opt_state, "mu", default=None)
    if mu is None or jax.tree.structure(mu) != jax.tree.structure(params):
        return params
    return jax.tree.map(lambda m, p: jax.sharding.NamedSharding(p.mesh, m.spec, memory_kind=p.memory_kind), mu,
                        params)


def jit_train_step(step: TrainStep, state_shardings, batch_shardings) -> JittedTrainStep:
    """The step's two programs jitted with the run's shardings (see ``JittedTrainStep``); on a mesh of several
    GPUs with the collective-overlap compiler options (``xla_flags.gpu_mesh_compiler_options``)."""
    mesh = getattr(jax.tree.leaves(state_shardings.params)[0], "mesh", None)
    options = gpu_mesh_compiler_options(mesh)
    grads = gradient_shardings(state_shardings)
    gradients = jax.jit(step.gradients, in_shardings=(state_shardings, batch_shardings),
                        out_shardings=(grads, None), compiler_options=options)
    update = jax.jit(step.update, in_shardings=(state_shardings, grads, None),
                     out_shardings=(state_shardings, None), donate_argnums=0, compiler_options=options)
    return JittedTrainStep(gradients, update)


def make_eval_step(cfg: TrainConfig, codec: ParamCodec, spec: StageSpec) -> Callable:
    """``eval(params, frozen, batch) -> (chosen [B, G], mean rejected [B, G], valid [B, G])``: the stage's
    reward (bt score; beta * pi otherwise) for held-out pairs."""

    def evaluate(params, frozen, batch):
        model = step_model(codec, cfg, params, frozen)
        eval_spec = spec if spec.stage != "sft" else dataclasses.replace(spec, stage="simpo")
        chosen, rejected, valid = group_values(model, batch, eval_spec, cfg.loss.chunk_tokens)
        return chosen, rejected.mean(-1), valid

    return jax.jit(evaluate)
