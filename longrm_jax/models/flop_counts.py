"""A model config's sizes as the FLOP counts of docs/flops.md use them: the decoder's matmul weights, the output
head's, and the attention's query-key pairs (sliding-window layers included) in training and in decoding."""

from __future__ import annotations

from longrm_jax.models.config import ModelConfig


def decoder_matmul_params(cfg: ModelConfig) -> int:
    """Weights that multiply activations in the decoder layers (attention and MLP; no embedding, no head):
    the ``N`` of the FLOP counts in docs/flops.md, without the output head."""
    d, f, n, k, h = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    return cfg.num_layers * (d * n * h * 2 + d * k * h * 2 + 3 * d * f)


def output_head_params(cfg: ModelConfig, head: str) -> int:
    """Weights of the output head: the LM head (``causal_lm``) or the score head."""
    return cfg.hidden_size * (cfg.vocab_size if head == "causal_lm" else cfg.num_labels)


def causal_squares(cfg: ModelConfig, length: float) -> float:
    """``sum over layers of S^2`` for the causal attention of one sequence of ``length`` tokens, as docs/flops.md
    counts it (``S^2`` stands for twice the S^2/2 query-key pairs of a causal layer). A sliding-window layer sees
    at most ``W`` keys per query: ``W^2/2 + (S - W) W`` pairs once ``S > W``, so it counts ``2 S W - W^2``."""
    s = float(length)
    local = sum(cfg.local_layers)
    w = float(cfg.sliding_window or 0)
    windowed = s * s if local == 0 or s <= w else 2.0 * s * w - w * w
    return (cfg.num_layers - local) * s * s + local * windowed


def attended_columns(cfg: ModelConfig, columns: float) -> float:
    """``sum over layers`` of the cache columns a decode step attends to with ``columns`` in the cache: every one
    on a global layer, at most ``W`` on a sliding-window layer."""
    local = sum(cfg.local_layers)
    return (cfg.num_layers - local) * columns + local * min(columns, float(cfg.sliding_window or columns))
