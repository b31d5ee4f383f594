"""From a packed data batch (docs/design.md "Batches") to the arrays a train step reads, on the mesh.

Everything that depends on token order is computed here in *natural* order, on the host, before the optional
zigzag reordering for sequence parallelism:
- ``targets[t]``: the token predicted by the logits at t, i.e. ``input_ids[t + 1]`` when t + 1 is in the same
  segment, else -1;
- ``target_mask[t]``: ``loss_mask[t + 1]`` for those positions (the contract's mask is on the predicted token);
- ``last_token_mask[t]``: 1 at the last token of every segment (where Bradley-Terry reads the score).
A *slotted* batch (``data.layout: rows``: one preference group per row, sample r in slot r of T / k tokens,
see ``data.packing``) is then reshaped to [B, k, T / k]: one sequence per row, which the step runs through the
model without segment ids (on GPU the attention backward is then cuDNN's flash kernel; packed rows need
tokamax's, which does not skip other segments' blocks).
Then, with a ``seq`` mesh axis of size s > 1, every row is permuted by
``parallel.zigzag.zigzag_permutation`` so each device's contiguous slice holds its zigzag chunks.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding

from longrm_jax.parallel.placement import batch_spec, place_process_rows
from longrm_jax.parallel.zigzag import zigzag_permutation

ROW_KEYS = ("input_ids", "positions", "segment_ids", "targets", "target_mask", "last_token_mask")


def prepare(batch: dict, *, seq_shards: int = 1, slots: int | None = None) -> dict:
    """Host-side step inputs from a packed batch (numpy in, numpy out); ``slots``: k of a slotted batch."""
    ids = np.asarray(batch["input_ids"], np.int32)
    seg = np.asarray(batch["segment_ids"], np.int32)
    loss_mask = np.asarray(batch["loss_mask"], np.int32)
    b, t = ids.shape
    same_next = np.zeros((b, t), bool)
    same_next[:, :-1] = (seg[:, 1:] == seg[:, :-1]) & (seg[:, :-1] > 0)
    targets = np.full((b, t), -1, np.int32)
    targets[:, :-1] = np.where(same_next[:, :-1], ids[:, 1:], -1)
    target_mask = np.zeros((b, t), np.int32)
    target_mask[:, :-1] = np.where(same_next[:, :-1], loss_mask[:, 1:], 0)
    last = ((seg > 0) & ~same_next).astype(np.int32)
    num_groups = batch.get("num_groups")
    if num_groups is None:  # SFT batches without groups: count the segments of each row
        num_groups = seg.max(axis=1)
    out = {
        "input_ids": ids,
        "positions": np.asarray(batch["positions"], np.int32),
        "segment_ids": seg,
        "targets": targets,
        "target_mask": target_mask,
        "last_token_mask": last,
    }
    if slots is not None:
        if t % slots:
            raise ValueError(f"slotted batch: row length {t} is not a multiple of {slots} slots")
        out = {k: v.reshape(b, slots, t // slots) for k, v in out.items()}
    if seq_shards > 1:
        perm = np.asarray(zigzag_permutation(out["input_ids"].shape[-1], seq_shards))
        out = {k: v[..., perm] for k, v in out.items()}
    out["num_groups"] = np.asarray(num_groups, np.int32)
    return out


def batch_shardings(mesh, *, slotted: bool = False) -> dict:
    rows = NamedSharding(mesh, batch_spec(3 if slotted else 2, slotted=slotted))
    out = {k: rows for k in ROW_KEYS}
    out["num_groups"] = NamedSharding(mesh, batch_spec(1))
    return out


def to_global(local: dict, mesh) -> dict:
    """Device arrays of the global batch from this process's rows (all rows when single-process).

    With several processes each one passes its own ``B / process_count`` rows, in process order.
    """
    return place_process_rows(local, batch_shardings(mesh, slotted=np.ndim(local["input_ids"]) == 3))


def process_rows(batch: dict) -> dict:
    """This process's share of a global host batch (rows split evenly, in process order)."""
    n, i = jax.process_count(), jax.process_index()
    if n == 1:
        return batch
    rows = next(iter(batch.values())).shape[0]
    if rows % n:
        raise ValueError(f"batch of {rows} rows does not split over {n} processes")
    per = rows // n
    return {k: v[i * per:(i + 1) * per] for k, v in batch.items()}
