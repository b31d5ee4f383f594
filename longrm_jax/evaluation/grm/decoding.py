"""What greedy decoding of a judge produces, shared by the static (``evaluation.grm.generation``) and the
continuous (``evaluation.grm.continuous``) schedules: one prompt's ``Generation`` and the verdict-letter
log-probabilities read at every step."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass
class Generation:
    """One prompt's greedy continuation (stop token excluded) and per-token verdict-letter log-probs."""

    tokens: np.ndarray  # int32 [n]
    letter_logprobs: np.ndarray  # float32 [n, num_letters]
    stopped: bool  # ended by a stop token (False: hit max_new_tokens)


def letter_logprobs(logits_bv: jax.Array, letter_ids: jax.Array) -> jax.Array:
    """[B, num_letters] log-probabilities of the verdict letters (-inf where a letter has no token, id -1)."""
    logp = jax.nn.log_softmax(logits_bv.astype(jnp.float32), axis=-1)
    safe = jnp.maximum(letter_ids, 0)
    return jnp.where(letter_ids[None, :] >= 0, logp[:, safe], -jnp.inf)
