"""Discriminative reward model scoring: jitted, batched, on length buckets.

Each sequence (a prompt with one answer, templated) is right-padded with the pad id to its bucket and the
``SequenceClassifier`` pools its score at the rightmost token that is not the pad id (as HF does), so padding
never changes a score: attention is causal and the pooled token precedes every pad. The score is label 0 of
the head (upstream reads ``logits[0][0]``).

On a mesh the rows are split over ``data`` x ``fsdp``; with a ``seq`` axis > 1 the tokens are split over it
and the model's attention runs as ring attention (lengths are padded to a multiple of the seq size).
"""

from __future__ import annotations

import logging

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from tqdm.auto import tqdm

from longrm_jax.evaluation.batching import pad_rows, plan_batches
from longrm_jax.parallel.placement import place_batch
from longrm_jax.parallel.zigzag import zigzag_permutation

logger = logging.getLogger(__name__)


def warn_past_positions(model, lengths: Sequence[int], what: str) -> None:
    """A warning when some sequence is longer than the positions the model was built for (its config's
    ``max_position_embeddings``): its scores or tokens there come from positions it never saw in training."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    longest = max(lengths, default=0)
    if positions and longest > positions:
        over = sum(n > positions for n in lengths)
        logger.warning("%d %s longer than the model's %d positions (max_position_embeddings), the longest %d "
                       "tokens: past its positions a model is untested; lower --max-length to cut them in the middle",
                       over, what, positions, longest)


def mesh_sizes(mesh: Mesh | None) -> tuple[int, int]:
    """(row multiple = data * fsdp, length multiple = seq) that inputs on ``mesh`` must respect."""
    if mesh is None:
        return 1, 1
    shape = dict(mesh.shape)
    return shape.get("data", 1) * shape.get("fsdp", 1), shape.get("seq", 1)


def _classifier_scores(model, input_ids):
    """Label-0 score pooled by the classifier itself (rightmost non-pad token, HF's rule)."""
    scores = model(input_ids)
    return scores[:, 0].astype(jnp.float32)


def _gathered_scores(model, input_ids, positions, pooled_index):
    """Label-0 score of the head at ``pooled_index`` per row (token order may be zigzagged for the ring)."""
    scores = model.token_scores(input_ids, positions)
    return jnp.take_along_axis(scores[..., 0], pooled_index[:, None], axis=1)[:, 0].astype(jnp.float32)


# Module-level so that every scorer shares the compiled functions (one compile per shape per process).
_JITTED_CLASSIFIER = jax.jit(_classifier_scores)
_JITTED_GATHERED = jax.jit(_gathered_scores)


def hf_pooled_index(ids: np.ndarray, lengths: np.ndarray, pad_id: int | None) -> np.ndarray:
    """HF's pooling rule applied to each unpadded row: its rightmost token that is not the config's
    ``pad_id`` (0 if none), or its last token when the config has no pad id."""
    if pad_id is None:
        return (lengths - 1).astype(np.int32)
    columns = np.arange(ids.shape[1])[None, :]
    keep = (ids != pad_id) & (columns < lengths[:, None])
    return np.where(keep, columns, 0).max(axis=1).astype(np.int32)


class DisRMScorer:
    """Scores token sequences with a ``SequenceClassifier``; one compile per (rows, bucket) shape."""

    def __init__(
        self,
        model,
        pad_id: int,
        *,
        batch_size: int = 8,
        max_batch_tokens: int | None = 131_072,
        mesh: Mesh | None = None,
    ):
        self.model = model
        self.pad_id = int(pad_id)
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.mesh = mesh
        _, self.seq_size = mesh_sizes(mesh)
        self.config_pad_id = getattr(getattr(model, "config", None), "pad_token_id", None)
        # The classifier pools by itself when it can: no sequence split and a pad id it knows (padding with
        # that id keeps HF's rule exact). Otherwise pool on the host's index into the head's per-token scores.
        self.self_pooling = self.seq_size == 1 and self.config_pad_id == self.pad_id
        self._forward = _JITTED_CLASSIFIER if self.self_pooling else _JITTED_GATHERED

    def _run(self, ids: np.ndarray, lengths: np.ndarray) -> jax.Array:
        if self.self_pooling:
            return self._forward(self.model, place_batch(ids, self.mesh))
        pooled = hf_pooled_index(ids, lengths, self.config_pad_id)
        positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
        if self.seq_size > 1:  # ring attention wants zigzag token order
            perm = zigzag_permutation(ids.shape[1], self.seq_size)
            ids, positions, pooled = ids[:, perm], positions[:, perm], np.argsort(perm)[pooled].astype(np.int32)
        return self._forward(self.model, place_batch(ids, self.mesh), place_batch(positions, self.mesh),
                             place_batch(pooled, self.mesh, ("batch",)))

    def score(self, sequences: Sequence[np.ndarray], progress: bool = True, desc: str = "DisRM scoring") -> np.ndarray:
        """float32 [N]: the score of each sequence (in the given order)."""
        row_multiple, _ = mesh_sizes(self.mesh)
        length_multiple = 2 * self.seq_size if self.seq_size > 1 else 1
        lengths = [len(s) for s in sequences]
        warn_past_positions(self.model, lengths, "sequences scored are")
        batches = plan_batches(lengths, max_rows=self.batch_size, max_batch_tokens=self.max_batch_tokens,
                               length_multiple=length_multiple, row_multiple=row_multiple)
        out = np.zeros(len(sequences), dtype=np.float32)
        bar = tqdm(total=sum(lengths), unit="tok", desc=desc, disable=not progress, unit_scale=True)
        for batch in batches:
            ids, row_lengths = pad_rows(sequences, batch, self.pad_id)
            if self.mesh is not None:
                with jax.set_mesh(self.mesh):
                    scores = self._run(ids, row_lengths)
            else:
                scores = self._run(ids, row_lengths)
            scores = np.asarray(jax.device_get(scores))
            for row, item in enumerate(batch.items):
                out[item] = scores[row]
            bar.update(sum(lengths[i] for i in batch.items))
        bar.close()
        return out
