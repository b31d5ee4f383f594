"""FLOP counts with sliding-window layers (docs/flops.md): a local layer's causal attention counts the keys its
window lets each query see, in training (step_flops), prefill estimates and the decode count of --compile-only.
The reference below sums query-key pairs one query at a time (HF's rule i - W < j <= i)."""

import numpy as np
import pytest

from longrm_jax.evaluation.compile_only import counted_flops
from longrm_jax.evaluation.grm.estimate import prefill_flops
from longrm_jax.models.config import ModelConfig
from longrm_jax.models.flop_counts import attended_columns, causal_squares
from longrm_jax.training.telemetry import step_flops

W = 16


def _config(windowed: bool) -> ModelConfig:
    types = ("sliding_attention",) * 5 + ("full_attention",) + ("sliding_attention",) if windowed else None
    extra = dict(sliding_window=W, layer_types=types) if windowed else {}
    return ModelConfig(family="qwen3", vocab_size=100, hidden_size=32, intermediate_size=64, num_layers=7,
                       num_heads=4, num_kv_heads=2, head_dim=8, **extra)


def _pairs(length: int, window: int | None) -> int:
    """Query-key pairs of causal attention over one sequence, counted query by query."""
    return sum(min(i + 1, window or length) for i in range(length))


@pytest.mark.parametrize("length", [5, 16, 17, 40, 300])
def test_causal_squares_counts_the_pairs_each_window_lets_through(length):
    windowed, full = _config(True), _config(False)
    # docs/flops.md counts S^2 for the S^2/2 pairs of a causal layer: the half diagonal (S/2 pairs; min(S, W)/2
    # on a windowed layer) is left out
    exact = 6 * _pairs(length, W) + 1 * _pairs(length, None)
    diagonal = (6 * min(length, W) + 1 * length) / 2
    assert 0.5 * causal_squares(windowed, length) == pytest.approx(exact - diagonal, rel=1e-12)
    assert causal_squares(full, length) == 7 * length * length
    assert causal_squares(windowed, length) <= causal_squares(full, length)


def test_step_prefill_and_decode_counts_use_the_window():
    windowed, full = _config(True), _config(False)
    seg = np.array([[1] * 200 + [2] * 56])
    heads = 6.0 * 4 * 8
    saved = step_flops(full, "causal_lm", seg) - step_flops(windowed, "causal_lm", seg)
    assert saved == pytest.approx(heads * 6 * ((200 ** 2 - (2 * 200 * W - W * W)) + (56 ** 2 - (2 * 56 * W - W * W))))
    assert prefill_flops(full, 300) - prefill_flops(windowed, 300) == pytest.approx(
        2.0 * 4 * 8 * 6 * (300 ** 2 - (2 * 300 * W - W * W)))
    assert attended_columns(windowed, 100) == 1 * 100 + 6 * W
    assert attended_columns(windowed, 10) == 7 * 10
    # 3 decode steps after a 100-token prompt: columns 101, 102, 103 on the global layer, W on each local one
    decode = counted_flops(windowed, "decode", rows=1, length=100, steps=3) - counted_flops(
        full, "decode", rows=1, length=100, steps=3)
    assert decode == pytest.approx(-4.0 * 4 * 8 * 6 * ((101 - W) + (102 - W) + (103 - W)))
