"""Training losses as pure functions (imports only jax).

Conventions (see docs/design.md, "Batches"):
- Targets are shifted by the caller: position t holds the token predicted by the logits at t, i.e. the
  natural-order ``input_ids[t + 1]`` when both tokens belong to the same packed segment, and a target mask
  (``target_mask``) that is 1 where that prediction is a trained response token.
- Per-example losses are returned; reductions (token mean over the global batch, mean over valid pairs) are
  left to the training step so gradient accumulation and sharding stay exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "sft_loss",
    "simpo_loss",
    "bradley_terry_loss",
    "token_logprobs",
    "segment_sums",
    "segment_mean_logprobs",
    "segment_last_values",
]


def _mean_rejects(chosen: jax.Array, rejected: jax.Array) -> jax.Array:
    """Rejected values with an optional trailing axis of R rejects, averaged to chosen's shape."""
    if rejected.ndim == chosen.ndim + 1:
        return jnp.mean(rejected, axis=-1)
    if rejected.shape != chosen.shape:
        raise ValueError(f"rejected shape {rejected.shape} does not match chosen {chosen.shape} (or chosen + [R])")
    return rejected


def sft_loss(token_logps: jax.Array, target_mask: jax.Array) -> jax.Array:
    """Per-token negative log-likelihood, zero where ``target_mask`` is 0.

    The upstream SFT loss is the token mean over all trained tokens of the global batch:
    ``sft_loss(...).sum() / target_mask.sum()`` (the step divides by the global count so accumulation is exact).
    """
    return -token_logps.astype(jnp.float32) * target_mask.astype(jnp.float32)


def simpo_loss(
    chosen_logps: jax.Array,
    rejected_logps: jax.Array,
    *,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
    nll_weight: float = 0.0,
    loss_type: str = "sigmoid",
) -> jax.Array:
    """SimPO per-example loss.

    ``chosen_logps`` [N]: mean response-token log-prob pi(chosen); ``rejected_logps`` [N] or [N, R] (several
    rejects are averaged, as upstream). ``gamma`` is the absolute margin (SimPO code: beta * gamma_beta_ratio).
    loss = -(1 - eps) log s(z) - eps log s(-z),  z = beta (pi_c - pi_r) - gamma;  plus ``nll_weight * -pi_c``
    (TRL CPO ``cpo_alpha``; 0 upstream). ``loss_type="hinge"``: ``relu(1 - z)`` instead (the SimPO paper's and
    upstream's hinge variant; label smoothing does not apply to it).
    """
    if loss_type not in ("sigmoid", "hinge"):
        raise ValueError(f"SimPO loss_type must be 'sigmoid' or 'hinge', got {loss_type!r}")
    chosen = chosen_logps.astype(jnp.float32)
    rejected = _mean_rejects(chosen, rejected_logps.astype(jnp.float32))
    z = beta * (chosen - rejected) - gamma
    if loss_type == "hinge":
        loss = jax.nn.relu(1.0 - z)
    else:
        loss = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(z) - label_smoothing * jax.nn.log_sigmoid(-z)
    if nll_weight:
        loss = loss + nll_weight * (-chosen)
    return loss


def bradley_terry_loss(
    chosen_scores: jax.Array,
    rejected_scores: jax.Array,
    *,
    margin: float = 0.0,
    center_rewards_coefficient: float = 0.0,
) -> jax.Array:
    """Bradley-Terry per-example loss ``-log s(r_c - mean r_r - margin)``.

    ``rejected_scores`` [N] or [N, R] (mean over rejects, as upstream). ``center_rewards_coefficient`` adds TRL's
    ``c * (r_c + r_r)^2`` (per example with r_r the mean reject; its batch mean is TRL's term for R = 1).
    """
    chosen = chosen_scores.astype(jnp.float32)
    rejected = _mean_rejects(chosen, rejected_scores.astype(jnp.float32))
    loss = -jax.nn.log_sigmoid(chosen - rejected - margin)
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * (chosen + rejected) ** 2
    return loss


def _num_chunks(tokens_per_row: int, rows: int, chunk_tokens: int) -> int:
    """Smallest divisor n of ``tokens_per_row`` with rows * tokens_per_row / n <= chunk_tokens."""
    target = max(1, -(-rows * tokens_per_row // max(chunk_tokens, 1)))
    for n in range(target, tokens_per_row + 1):
        if tokens_per_row % n == 0:
            return n
    return tokens_per_row


def token_logprobs(
    hidden_btd: jax.Array,
    lm_head_dv: jax.Array,
    targets_bt: jax.Array,
    *,
    chunk_tokens: int = 8192,
    logits_dtype=jnp.float32,
    needed_bt: jax.Array | None = None,
) -> jax.Array:
    """log p(targets[b, t] | hidden[b, t]) as fp32 [B, T], without the [B*T, V] logits existing at once.

    Tokens are processed in chunks of about ``chunk_tokens`` under ``jax.checkpoint`` inside ``lax.map``: the
    backward recomputes each chunk's logits instead of storing them. Targets outside [0, V) (e.g. -1 padding)
    give log-prob 0 - mask them anyway.

    Without ``needed_bt``, chunk c takes the strided tokens ``t = i * n + c`` so that, when T is sharded over a
    ``seq`` mesh axis, every chunk holds local tokens of every shard (no resharding). With ``needed_bt`` (bool
    [B, T], the tokens whose log-prob is used; only for T not sharded), chunks are contiguous runs of one row
    and a chunk without a needed token is skipped (``lax.cond``; its log-probs are 0): preference and SFT
    losses read only the response tokens, a few hundred of a 32K-token row, so the LM head then costs a few
    chunks instead of the whole row (Qwen3-8B: 151,936 x 4,096 per token, forward and backward).
    """
    b, t, d = hidden_btd.shape
    vocab = lm_head_dv.shape[-1]

    def logps(h_c, y_c):
        logits = jnp.einsum("...d,dv->...v", h_c, lm_head_dv, preferred_element_type=jnp.float32)
        logits = logits.astype(logits_dtype).astype(jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)
        valid = (y_c >= 0) & (y_c < vocab)
        picked = jnp.take_along_axis(logits, jnp.where(valid, y_c, 0)[..., None], axis=-1)[..., 0]
        return jnp.where(valid, picked - lse, 0.0)

    if needed_bt is not None:
        size = t // _num_chunks(t, 1, chunk_tokens)  # tokens per chunk, a divisor of T
        h = hidden_btd.reshape(b * (t // size), size, d)
        y = targets_bt.reshape(-1, size)
        need = needed_bt.reshape(-1, size).any(axis=-1)

        @jax.checkpoint
        def block(args):
            h_c, y_c, need_c = args
            return jax.lax.cond(need_c, logps, lambda _, y: jnp.zeros_like(y, jnp.float32), h_c, y_c)

        return jax.lax.map(block, (h, y, need)).reshape(b, t)

    n = _num_chunks(t, b, chunk_tokens)
    # [B, T, D] -> [n, B, T/n, D] with t = i * n + c (c the chunk index).
    h = jnp.moveaxis(hidden_btd.reshape(b, t // n, n, d), 2, 0)
    y = jnp.moveaxis(targets_bt.reshape(b, t // n, n), 2, 0)
    out = jax.lax.map(jax.checkpoint(lambda args: logps(*args)), (h, y))  # [n, B, T/n]
    return jnp.moveaxis(out, 0, 2).reshape(b, t)


def segment_sums(values_bt: jax.Array, segment_ids_bt: jax.Array, num_segments: int) -> jax.Array:
    """Sum of ``values`` per packed segment: [B, T] -> [B, num_segments] (segment s at column s - 1; 0 = pad)."""
    onehot = segment_ids_bt[..., None] == jnp.arange(1, num_segments + 1, dtype=segment_ids_bt.dtype)
    return jnp.einsum("bt,bts->bs", values_bt.astype(jnp.float32), onehot.astype(jnp.float32))


def segment_mean_logprobs(
    token_logps_bt: jax.Array, target_mask_bt: jax.Array, segment_ids_bt: jax.Array, num_segments: int
) -> tuple[jax.Array, jax.Array]:
    """Mean response-token log-prob per segment (SimPO's pi) and the token counts, both [B, num_segments].

    Segments without response tokens get pi = 0 and count 0 (callers mask them out).
    """
    mask = target_mask_bt.astype(jnp.float32)
    sums = segment_sums(token_logps_bt * mask, segment_ids_bt, num_segments)
    counts = segment_sums(mask, segment_ids_bt, num_segments)
    return sums / jnp.maximum(counts, 1.0), counts


def segment_last_values(
    values_bt: jax.Array, last_token_mask_bt: jax.Array, segment_ids_bt: jax.Array, num_segments: int
) -> jax.Array:
    """Value at each segment's last token (``last_token_mask`` marks it): [B, T] -> [B, num_segments]."""
    return segment_sums(values_bt * last_token_mask_bt.astype(jnp.float32), segment_ids_bt, num_segments)
