"""Held-out pairwise accuracy during a run: the stage's reward (a BT score; beta x the policy's mean log-prob
otherwise, SFT included) of each held-out chosen sequence against its rejected ones, before and after training."""

from __future__ import annotations

import numpy as np
from jax.experimental import multihost_utils

from longrm_jax.training import batches as batch_lib
from longrm_jax.training.config_schema import TrainConfig
from longrm_jax.training.step_groups import groups_bound
from longrm_jax.training.steps import StageSpec, make_eval_step


def pairwise_accuracy(eval_fn, state, eval_host: list[dict], mesh, seq_shards: int,
             slots: int | None = None) -> float | None:
    """Pairwise accuracy (chosen reward > mean rejected reward) over held-out batches.

    Every process feeds its own rows of each batch and gets the whole batch's values back (a global array's
    rows on other processes' devices cannot be fetched directly), so all processes return the same figure."""
    if not eval_host:
        return None
    correct = total = 0.0
    for host in eval_host:
        batch = batch_lib.to_global(
            batch_lib.prepare(batch_lib.process_rows(host), seq_shards=seq_shards, slots=slots), mesh)
        chosen, rejected, valid = multihost_utils.process_allgather(eval_fn(state.params, state.frozen, batch),
                                                                    tiled=True)
        correct += float(((chosen > rejected) & valid).sum())
        total += float(valid.sum())
    return correct / max(total, 1.0)


def eval_step_for(cfg: TrainConfig, codec, eval_host: list[dict], slotted: bool):
    """The jitted held-out step, compiled for the most groups per row among ``eval_host``'s batches."""
    eval_groups = max([int(np.max(b["num_groups"])) for b in eval_host] + [1])
    return make_eval_step(cfg, codec, StageSpec(cfg.stage, cfg.data.num_rejects, groups_bound(cfg, eval_groups),
                                                slotted))
