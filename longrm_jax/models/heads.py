"""The two heads on the decoder: ``CausalLM`` (logits, optionally tied to the embedding; Gemma 3's tanh cap) and
``SequenceClassifier`` (a score at the last non-pad token, as HF pools it), and ``build_model`` for either."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from longrm_jax.models.cache import KVCache
from longrm_jax.models.config import ModelConfig
from longrm_jax.models.decoder import Decoder, make_param
from longrm_jax.models.layers import constrain


class _DecoderHead(nnx.Module):
    """What both heads share: the decoder under ``self.model`` and its hidden states and KV cache."""

    config: ModelConfig
    model: Decoder

    def hidden_states(self, input_ids, positions=None, segment_ids=None) -> jax.Array:
        """Final-norm hidden states [B, T, D] (for chunked log-probs without materialising logits)."""
        return self.model(input_ids, positions, segment_ids)[0]

    def use_decode_attention(self, impl: str, unroll_layers: bool | None = None) -> None:
        """Set ``ModelConfig.decode_attention`` (and ``unroll_cached_layers`` unless None) of this model in place
        (the head's and the decoder's config)."""
        changes = {"decode_attention": impl}
        if unroll_layers is not None:
            changes["unroll_cached_layers"] = unroll_layers
        self.replace_config(**changes)

    def replace_config(self, **changes) -> None:
        """Replace fields of this model's ``ModelConfig`` in place (the head's and the decoder's), e.g. the
        inference-only settings of :func:`longrm_jax.evaluation.grm.generation.prepare_for_decoding`."""
        cfg = self.config.replace(**changes)
        self.config = cfg
        self.model.config = cfg

    def init_cache(self, batch: int, max_len: int, dtype=None, window_rings: bool = True) -> KVCache:
        """Empty KV cache of ``max_len`` slots for ``self.model(..., cache=...)`` (dtype default: compute dtype).
        Sliding-window layers keep rings of their window (``models.window_cache``) unless ``window_rings`` is
        False (every layer at full length: the reference the rings are tested against)."""
        cfg = self.config
        return KVCache.create(cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim,
                              dtype or cfg.compute_dtype, cfg.local_layers if window_rings else (),
                              cfg.sliding_window)


class CausalLM(_DecoderHead):
    """Decoder + LM head (tied to the embedding or its own ``lm_head`` [D, V])."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, rules: Mapping | None = None):
        self.config = cfg
        self.model = Decoder(cfg, rngs=rngs, rules=rules)
        self.lm_head = (
            None if cfg.tie_word_embeddings
            else make_param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), "normal", cfg)
        )

    def lm_head_weight(self) -> jax.Array:
        """[D, V] output projection (the embedding's transpose when tied), in the parameter dtype. For callers
        that turn hidden states into logits themselves (chunked log-probs): refused where the model caps its
        logits (``final_logit_softcapping``), which such a caller would skip."""
        if self.config.final_logit_softcapping is not None:
            raise NotImplementedError(
                f"final_logit_softcapping={self.config.final_logit_softcapping}: logits computed from "
                "lm_head_weight() would miss the tanh cap; call the model for logits (Gemma 3 checkpoints set "
                "no cap)")
        return self._head_weight()

    def _head_weight(self) -> jax.Array:
        return self.model.embed[...].T if self.lm_head is None else self.lm_head[...]

    def __call__(self, input_ids, positions=None, segment_ids=None, *, cache: KVCache | None = None,
                 prefill: bool = False, logits_at: jax.Array | None = None,
                 write_at: tuple[jax.Array, jax.Array] | None = None):
        """Logits [B, T, V]; with ``cache``: (logits, new cache).

        input_ids, positions, segment_ids: int32 [B, T] (positions default: arange per segment; segment 0 =
        padding). With a cache the T tokens are written at slots [cache.index, cache.index + T) and attend to
        every earlier slot of their segment; ``prefill=True`` promises the cache is empty, so attention runs
        over the new tokens with the fast kernel. ``logits_at`` int32 [B]: return logits [B, 1, V] at that
        index per row only (e.g. each prompt's last token) instead of all T.

        ``write_at`` (row, columns int32 [T]): a prefill of one prompt (B = 1) whose keys and values go to
        cache row ``row`` at ``columns`` (a continuous-batching pool's ring columns) instead of slots from
        ``cache.index``; the cache's positions, segment ids and index are left to the caller.
        """
        hidden, new_cache = self.model(input_ids, positions, segment_ids, cache=cache, prefill=prefill,
                                       write_at=write_at)
        if logits_at is not None:
            hidden = jnp.take_along_axis(hidden, logits_at.astype(jnp.int32)[:, None, None], axis=1)
        logits = jnp.einsum("btd,dv->btv", hidden, self._head_weight().astype(hidden.dtype))
        cap = self.config.final_logit_softcapping
        if cap is not None:  # HF: tanh(logits / cap) * cap, in the logits' dtype
            logits = jnp.tanh(logits / cap) * cap
        logits = constrain(logits, ("batch", "seq", "act_vocab"), self.model.rules)
        return logits if cache is None else (logits, new_cache)


def pooled_index(input_ids: jax.Array, pad_token_id: int | None) -> jax.Array:
    """Index [B] of the rightmost token that is not ``pad_token_id``, exactly as HF's
    ``*ForSequenceClassification``: 0 when a row is all padding; the last token when there is no pad id
    (HF then refuses batches larger than 1, and so do we)."""
    batch, length = input_ids.shape
    if pad_token_id is None:
        if batch != 1:
            raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined (pad_token_id is None)")
        return jnp.full((batch,), length - 1, jnp.int32)
    non_pad = (input_ids != pad_token_id).astype(jnp.int32)
    return jnp.argmax(jnp.arange(length, dtype=jnp.int32) * non_pad, axis=-1).astype(jnp.int32)


class SequenceClassifier(_DecoderHead):
    """Decoder + ``score`` Linear(hidden, num_labels, no bias), pooled at the last non-pad token."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, rules: Mapping | None = None):
        self.config = cfg
        self.model = Decoder(cfg, rngs=rngs, rules=rules)
        self.score = make_param(rngs, (cfg.hidden_size, cfg.num_labels), ("embed", "labels"), "normal", cfg)

    def token_scores(self, input_ids, positions=None, segment_ids=None) -> jax.Array:
        """Score head on every token: [B, T, num_labels] (training gathers each segment's last token)."""
        hidden = self.hidden_states(input_ids, positions, segment_ids)
        return jnp.einsum("btd,dl->btl", hidden, self.score[...].astype(hidden.dtype))

    def __call__(self, input_ids, positions=None, segment_ids=None) -> jax.Array:
        """Scores [B, num_labels] at the rightmost non-pad token of each row (HF pooling)."""
        hidden = self.hidden_states(input_ids, positions, segment_ids)
        idx = pooled_index(input_ids, self.config.pad_token_id)
        pooled = jnp.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0]
        return pooled @ self.score[...].astype(pooled.dtype)


def build_model(cfg: ModelConfig, *, rngs: nnx.Rngs | None = None, rules: Mapping | None = None):
    """``CausalLM`` or ``SequenceClassifier`` per ``cfg.head``, randomly initialised like HF."""
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    cls = CausalLM if cfg.head == "causal_lm" else SequenceClassifier
    return cls(cfg, rngs=rngs, rules=rules)
