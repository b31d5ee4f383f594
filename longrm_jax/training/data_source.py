"""Training and evaluation batches for a run, with a resumable iterator state.

Synthetic runs (``data.source: synthetic``) generate needle-in-a-haystack preference groups with
``data.synthetic`` (held-out pairs come from a different seed), tokenize them with the run's chat tokenizer and
pack them (``data.packing``). File sources are read with the data package's readers.

Training batches stream from the data package's grain pipeline (``data.pipeline.make_train_iterator``): records
are shuffled per epoch, tokenized and packed window by window, and each process receives its own rows of every
global batch. The iterator's state (grain's) is saved in every checkpoint, so a resumed run sees exactly the
batches it would have seen. Held-out evaluation pairs are packed once, in memory.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from longrm_jax.cli_support import InputError
from longrm_jax.data import synthetic
from longrm_jax.data.blend import BlendSource, blend
from longrm_jax.data.packing import pack_batches, unpack_row
from longrm_jax.data.readers import read_records
from longrm_jax.data.records import PreferenceRecord, Provenance, SFTRecord
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
from longrm_jax.data.tokenize import ChatTokenizer, TruncationConfig, TruncationStats
from longrm_jax.training.config_schema import DataSection, TrainConfig

logger = logging.getLogger(__name__)


def load_tokenizer(data: DataSection) -> ChatTokenizer:
    """The run's chat tokenizer: ``data.tokenizer`` (the bundled tiny one when unset) with its template options."""
    path = data.tokenizer
    if path is None:
        path = TINY_TOKENIZER_DIR
    return ChatTokenizer.from_dir(path, enable_thinking=data.enable_thinking, chat_template=data.chat_template,
                                  response_end=data.response_end)


def _synthetic_rows(cfg: TrainConfig, n: int, seed: int) -> list[dict]:
    opts = dict(cfg.data.synthetic)
    per_row = 1 if cfg.data.layout == "rows" else 1 + cfg.data.num_rejects  # sequences sharing seq_len
    lengths = opts.pop("lengths", None) or [cfg.data.seq_len // (2 * per_row)]
    return synthetic.training_rows(n, seed, lengths, num_rejects=max(cfg.data.num_rejects, 1), **opts)


def _records(cfg: TrainConfig, rows: list[dict], source: str, sft: bool):
    out = []
    for i, r in enumerate(rows):
        prov = Provenance(source, i)
        prompt = tuple(r["chat_template"])
        if sft:
            out.append(SFTRecord(prompt, r.get("golden", r.get("chosen")), prov))
        else:
            out.append(PreferenceRecord(prompt, r["chosen"], tuple(r["rejects"]), prov))
    return out


def _file_records(cfg: TrainConfig, path: str, sft: bool, key: str = "data.source"):
    """Records of a dataset file or directory in any format the data package reads (upstream JSON-lines,
    HF ``save_to_disk``); the split is taken from ``data.split``-style suffix ``path:split`` if given."""
    split = None
    if ":" in os.path.basename(path):
        path, split = path.rsplit(":", 1)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{key}: {path} does not exist (expected a .jsonl, .json or .parquet file or a "
                                "datasets save_to_disk directory; PATH:SPLIT picks a split)")
    records = list(read_records(path, "sft" if sft else "preference", split=split))
    if not records:
        raise InputError(f"{path}{':' + split if split else ''}: no {'SFT' if sft else 'preference'} records "
                         "(the file or split is empty)")
    return records


def slots(cfg: TrainConfig) -> int | None:
    """Sequences per group row of a ``data.layout: rows`` batch (None for packed rows)."""
    return 1 + cfg.data.num_rejects if cfg.data.layout == "rows" else None


def packed_batches(cfg: TrainConfig, tokenizer: ChatTokenizer, records, *, sft: bool, batch_rows: int) -> list[dict]:
    r = 0 if sft else cfg.data.num_rejects
    trunc = TruncationConfig(policy=cfg.data.truncation, max_length=cfg.data.seq_len)
    stats = TruncationStats()
    groups = [tokenizer.tokenize(rec, num_rejects=max(r, 1), truncation=trunc, stats=stats) for rec in records]
    k = slots(cfg)
    batches = pack_batches(groups, ((k or 1) * cfg.data.seq_len,), batch_rows, 1 + r, tokenizer.pad_id,
                           tokenizer.eos_id, cfg.data.truncation, stats, slotted=k is not None,
                           max_groups=cfg.data.groups_per_row)
    stats.log_summary(logger, f"{len(groups)} held-out records", cfg.data.truncation, (k or 1) * cfg.data.seq_len)
    return batches


def train_records(cfg: TrainConfig):
    sft = cfg.stage == "sft"
    if cfg.data.sources:
        sources = [BlendSource.parse(entry, f"data.sources[{i}]") for i, entry in enumerate(cfg.data.sources)]
        return blend(sources, lambda path: _file_records(cfg, path, sft, "data.sources"), seed=cfg.seed)
    if cfg.data.source == "synthetic":
        return _records(cfg, _synthetic_rows(cfg, cfg.data.num_train, cfg.seed), "synthetic:train", sft)
    return _file_records(cfg, cfg.data.source, sft)


def train_iterator(cfg: TrainConfig, tokenizer: ChatTokenizer, records=None, *, num_epochs: int | None = None,
                   report: bool = True):
    """The grain training iterator (this process's rows of each global batch; ``num_epochs=None``: forever).
    ``report``: log the data summary line after the first pass."""
    from longrm_jax.data.pipeline import make_train_iterator  # grain and orbax: imported when a run reads data

    d = cfg.data
    records = train_records(cfg) if records is None else records
    k = slots(cfg) or 1  # a "rows" group is packed as one row of k slots of seq_len, then reshaped
    row = k * d.seq_len
    return make_train_iterator(
        records, tokenizer, stage=cfg.stage, num_rejects=max(d.num_rejects, 1), max_length=row,
        # One bucket: exactly the row length; several: the pipeline's (slot lengths multiples of bucket_multiple).
        buckets=None if d.num_buckets > 1 else (row,), num_buckets=d.num_buckets, bucket_multiple=d.bucket_multiple,
        bucket_scheme=d.bucket_scheme,
        batch_size=cfg.pipeline_rows_per_step, seed=cfg.seed, shuffle=d.shuffle, num_epochs=num_epochs,
        window_groups=d.window_groups, worker_count=max(1, d.worker_count), slotted=k > 1, seq_len=d.seq_len,
        truncation=d.truncation, report=report, groups_per_row=d.groups_per_row,
    )


def degenerate_groups(batch: dict, group_size: int) -> tuple[int, int]:
    """(groups whose chosen sequence equals one of its rejected ones token for token, loss mask included;
    groups) in a packed host batch. Such a pair has the same reward on both sides and so no gradient: the sign
    of rows cut by truncation until only the shared prompt is left."""
    bad = total = 0
    for row in range(batch["segment_ids"].shape[0]):
        segments = unpack_row(batch, row)
        for start in range(0, len(segments) - group_size + 1, group_size):
            (chosen_ids, chosen_mask), *rejected = segments[start:start + group_size]
            total += 1
            bad += any(np.array_equal(chosen_ids, ids) and np.array_equal(chosen_mask, mask) for ids, mask in rejected)
    return bad, total


def count_batches(cfg: TrainConfig, tokenizer: ChatTokenizer, records) -> int:
    """Global batches in one epoch (a dry pass over the pipeline, to size the learning-rate schedule)."""
    it = train_iterator(cfg, tokenizer, records, num_epochs=1, report=False)  # the training pass reports
    try:
        return sum(1 for _ in it)
    finally:
        it.close()


def missing_eval_reason(cfg: TrainConfig) -> str:
    """Why :func:`eval_batches` gave nothing: a file source without a held-out file, synthetic held-out pairs
    turned off (data.num_eval=0), or held-out pairs that were all dropped (e.g. identical after truncation)."""
    if cfg.data.eval_source is None and cfg.data.source != "synthetic":
        return (f"no held-out pairs: data.source {cfg.data.source} has no held-out split and data.eval_source is "
                "unset (set it to a held-out file to measure pairwise accuracy)")
    if cfg.data.eval_source in (None, "synthetic") and cfg.data.num_eval == 0:
        return "held-out evaluation is off (data.num_eval=0)"
    source = cfg.data.eval_source or "synthetic"
    return (f"no held-out pairs left: every held-out pair of {source} was dropped (identical after truncation to "
            f"data.seq_len={cfg.data.seq_len}, data.truncation {cfg.data.truncation}; see the data summary line): "
            "raise data.seq_len" + (" or use data.truncation prompt_middle" if cfg.data.truncation != "prompt_middle"
                                    else ""))


def eval_batches(cfg: TrainConfig, tokenizer: ChatTokenizer) -> list[dict]:
    """Held-out preference pairs (every stage is evaluated by pairwise accuracy)."""
    if cfg.data.eval_source is None and cfg.data.source != "synthetic":
        return []
    if cfg.data.eval_source in (None, "synthetic"):
        rows = _synthetic_rows(cfg, cfg.data.num_eval, cfg.seed + 1_000_003)
        records = _records(cfg, rows, "synthetic:eval", False)
    else:  # _file_records checks the path (a PATH:SPLIT without its split), naming data.eval_source
        records = _file_records(cfg, cfg.data.eval_source, False, "data.eval_source")
    # One micro step's rows at a time (the eval step runs no accumulation).
    return packed_batches(cfg, tokenizer, records, sft=False,
                          batch_rows=max(cfg.pipeline_rows_per_step // cfg.grad_accum, 1))
