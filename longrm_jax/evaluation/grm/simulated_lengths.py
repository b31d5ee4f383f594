"""Simulated judgement lengths, for throughput benchmarks with random-weight models.

A generative judge writes an analysis and a verdict, then its EOS: lengths vary per sample, some judgements
stop after a short analysis and some run to the token budget. A random-weight model never writes an EOS, so a
benchmark that let it run would time every judgement at the full budget and overstate the decode work (and
hide what continuous batching gains). With ``--simulate-judgement-lengths`` each prompt instead gets a budget
drawn once from this distribution, deterministically from the prompt's tokens (the same prompt gets the same
length in any batch, order or framework, so the PyTorch peer can be given identical lengths):

* ``RUN_TO_BUDGET`` (a quarter) of the judgements run to ``max_new_tokens``;
* the others are log-uniform between ``min(MIN_TOKENS, max_new_tokens)`` and ``max_new_tokens``.

The distribution is an assumption made for timing (no real judgement lengths of the benchmark are stored in
this repository); its only purpose is a realistic mix of early and late stops. Predictions made this way are
meaningless as judgements.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

RUN_TO_BUDGET = 0.25
MIN_TOKENS = 128


def judgement_length(prompt: np.ndarray, max_new_tokens: int, seed: int = 0) -> int:
    """Simulated length (tokens, in [1, max_new_tokens]) of the judgement of ``prompt`` (int ids)."""
    digest = hashlib.sha256(np.asarray(prompt, np.int64).tobytes() + seed.to_bytes(8, "little")).digest()
    u_run, u_len = (int.from_bytes(digest[i:i + 8], "little") / 2**64 for i in (0, 8))
    if u_run < RUN_TO_BUDGET:
        return int(max_new_tokens)
    low = min(MIN_TOKENS, max_new_tokens)
    return int(max(1, min(max_new_tokens, round(math.exp(math.log(low) + u_len * math.log(max_new_tokens / low))))))


def judgement_lengths(prompts: Sequence[np.ndarray], max_new_tokens: int, seed: int = 0) -> list[int]:
    return [judgement_length(p, max_new_tokens, seed) for p in prompts]
