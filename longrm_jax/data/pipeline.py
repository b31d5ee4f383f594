"""The training input pipeline (grain): records -> shuffled windows -> tokenized, packed [B, T] batches.

Trainer API::

    it = make_train_iterator(data, tokenizer, stage="simpo", num_rejects=1, max_length=131_072,
                             batch_size=8, seed=0, num_epochs=1)
    batch = next(it)            # dict of numpy int32: input_ids/positions/segment_ids/loss_mask [b, T],
                                # num_groups [b]; b = batch_size // process_count, T in it.buckets
    state = it.get_state()      # JSON-serialisable dict; store it with the checkpoint
    it.set_state(state)         # (on a fresh iterator with the same arguments) continue exactly there
    it.batch_spec(T)            # {name: (shape, dtype)} of a batch of row length T (per process)
    it.stats()                  # {"samples", "truncated_samples", "dropped_tokens", "skipped_rows", and the
                                # rule counters of data.tokenize.RULE_COUNTERS (prompt cuts, own rows, ...)}

`data`: a path (see `readers`), a `RecordSource`, or a sequence of `SFTRecord` / `PreferenceRecord`.
Other arguments (`PipelineConfig`): `buckets` (or `num_buckets`, `bucket_multiple`), `window_groups` (default:
bounded by the row length, `auto_window_groups`),
`truncation` ("prompt_middle" | "right" | "error", per sequence), `seq_len`, `slotted` (one
group per row, sample r in slot r of `row length / group_size` tokens: see `packing`), `skip_bad_rows`, `reject_selection` ("first" |
"random": a seeded subset when a row has more rejected than `num_rejects`), `shuffle`, `prefetch`,
`worker_count`, `process_index` / `process_count` (default: jax's). Names shared with the trainer's `data:`
config section mean the same there.
`tokenizer`: a `ChatTokenizer` or a tokenizer directory. `stage`: "sft" (groups of 1 sample) or
"simpo"/"bt"/"preference" (groups of 1 + `num_rejects`). Batch layout: docs/design.md "Batches".

How (all deterministic in `seed`, so every host computes the same plan):
1. `grain.MapDataset.source(records)`, `.shuffle()` (a different permutation every epoch), `.repeat(num_epochs)`.
2. `.batch(window_groups)`: windows of groups; each window is tokenized (with `seq_len` truncation),
   each sequence fitted to the largest bucket on its own, packed first-fit-decreasing into rows, rows into
   batches of `batch_size` rows of one bucket length (`packing.pack_batches`; a group too long to share a row
   comes in a row of its own, `group_size` x the largest bucket long; identical pairs are dropped and
   counted), and the batch order shuffled within the window.
   Windows are computed ahead by `worker_count` threads (`to_iter_dataset` read options).
3. A grain flat-map yields the window's batches one by one, each process keeping its rows
   `[p * b, (p + 1) * b)` of the global batch: all hosts see the same shapes at every step and the same
   number of steps, and a group never straddles hosts or rows.
4. `ThreadPrefetchIterDataset` prefetches `prefetch` batches.

Resume: grain's iterator state is (window index, batch index within the window); restoring recomputes that
window (deterministic) and skips what was consumed, so a restored iterator yields exactly the batches the
uninterrupted one would. The state holds a fingerprint of the arguments; restoring with different ones
raises. Rows of one window may end with empty rows (`num_groups == 0`) to complete the last batch.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import grain
import jax
import numpy as np

from longrm_jax.data.packing import batch_spec, make_buckets, pack_batches
from longrm_jax.data.readers import RecordSource
from longrm_jax.data.records import DataError, PreferenceRecord, SFTRecord
from longrm_jax.data.tokenize import ChatTokenizer, TruncationConfig, TruncationStats

logger = logging.getLogger(__name__)

STATE_VERSION = 1
PREFERENCE_STAGES = ("simpo", "bt", "preference")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    stage: str = "simpo"  # "sft" or one of PREFERENCE_STAGES
    num_rejects: int = 1
    max_length: int = 131_072  # largest row length
    batch_size: int = 1  # global rows per step
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = 1  # None: repeat forever
    buckets: tuple[int, ...] | None = None  # default make_buckets(max_length, num_buckets, bucket_multiple)
    num_buckets: int = 4
    bucket_multiple: int = 128
    bucket_scheme: str = "halving"  # packing.make_buckets
    window_groups: int | None = None  # groups packed together (bigger: fuller rows, more memory); None: auto
    # Each sequence longer than seq_len / the row, on its own: "prompt_middle" (cut the prompt's middle,
    # keep the response), "right" (upstream's literal right cut) or "error" (see data.tokenize).
    truncation: str = "prompt_middle"
    seq_len: int | None = None  # tokens per sequence at most, before packing (default: the longest row / slot)
    slotted: bool = False  # preference stages: one group per row, each sample in its own equal slot
    groups_per_row: int | None = None  # packed rows: at most this many groups (SFT samples) per row
    skip_bad_rows: bool = False
    reject_selection: str = "first"  # "first" or "random" (seeded per row, as upstream's random.sample)
    process_index: int = 0
    process_count: int = 1
    prefetch: int = 2
    worker_count: int = 2  # threads tokenizing / packing windows ahead

    def __post_init__(self):
        if self.stage != "sft" and self.stage not in PREFERENCE_STAGES:
            raise ValueError(f"stage must be 'sft' or one of {PREFERENCE_STAGES}, got {self.stage!r}")
        if self.batch_size % self.process_count:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by process_count "
                             f"{self.process_count}")
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(f"process_index {self.process_index} not in [0, {self.process_count})")
        if self.truncation not in ("prompt_middle", "right", "error"):
            raise ValueError("training truncation must be 'prompt_middle', 'right' or 'error', "
                             f"got {self.truncation!r}")
        if self.reject_selection not in ("first", "random"):
            raise ValueError(f"reject_selection must be 'first' or 'random', got {self.reject_selection!r}")
        if self.num_epochs is not None and self.num_epochs <= 0:
            raise ValueError("num_epochs must be positive or None")
        if self.slotted and self.stage == "sft":
            raise ValueError("slotted rows hold one preference group each; stage 'sft' packs samples")

    @property
    def group_size(self) -> int:
        return 1 if self.stage == "sft" else 1 + self.num_rejects

    @property
    def resolved_buckets(self) -> tuple[int, ...]:
        if self.buckets is not None:
            return tuple(sorted(self.buckets))
        # Slotted rows: every slot (row / group_size) a multiple of bucket_multiple.
        multiple = self.bucket_multiple * (self.group_size if self.slotted else 1)
        return make_buckets(self.max_length, self.num_buckets, multiple, self.bucket_scheme)

    @property
    def resolved_window_groups(self) -> int:
        """``window_groups``, or by default (None) ``auto_window_groups`` of the row length and batch rows."""
        if self.window_groups is not None:
            return self.window_groups
        return auto_window_groups(self.max_length, self.batch_size)

    @property
    def rows_per_process(self) -> int:
        return self.batch_size // self.process_count


# Default packing window, in tokens of row capacity. A window is tokenized and packed before its first batch is
# yielded, so the first step waits for it and host memory holds it (twice, with prefetch): 256 groups of 2 x 130K
# tokens took ~200 s to tokenize before the first 2 x 128K step. Packing quality needs only a few rows' worth of
# candidates when rows are long, so the window shrinks with the row length: 256 groups up to 16K-token rows,
# 128 at 32K, 32 at 128K, 16 at 256K; never fewer than one batch's rows (nor 8).
WINDOW_TOKENS = 1 << 22
MAX_WINDOW_GROUPS = 256
MIN_WINDOW_GROUPS = 8


def auto_window_groups(row_tokens: int, batch_rows: int = 1) -> int:
    """Groups per packing window for rows of ``row_tokens`` tokens and batches of ``batch_rows`` rows."""
    by_tokens = min(MAX_WINDOW_GROUPS, max(MIN_WINDOW_GROUPS, WINDOW_TOKENS // max(1, row_tokens)))
    return max(by_tokens, batch_rows)


class _BadRow:
    """Placeholder for a row that failed validation (kept so that indices and state stay aligned)."""

    def __init__(self, error: DataError):
        self.error = error


class _SafeSource:
    """Random access that returns `_BadRow` instead of raising, so that skips happen in the window step."""

    def __init__(self, records):
        self._records = records

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, i: int):
        try:
            return self._records[i]
        except DataError as e:
            return _BadRow(e)


class NoTrainableDataError(ValueError):
    """A whole pass over the training records produced no batch (every group dropped or skipped)."""

    exit_code = 3  # training stopped on its data (README, "Exit status")


class _WindowPacker:
    """Tokenize, fit, pack and batch one window; shuffle the order of its batches."""

    def __init__(self, tokenizer: ChatTokenizer, cfg: PipelineConfig, stats: TruncationStats, num_records: int,
                 report: bool = True):
        self.tok, self.cfg, self.stats = tokenizer, cfg, stats
        self.report = report  # log the data summary line once the first pass is done
        # Without this check a run whose every group is dropped would wait forever for its first batch.
        self.num_records, self.records_seen, self.batches_made = num_records, 0, 0
        longest = max(cfg.resolved_buckets) // (cfg.group_size if cfg.slotted else 1)
        self.truncation = TruncationConfig(policy=cfg.truncation, max_length=cfg.seq_len or longest)
        self.skipped = 0
        self._lock = threading.Lock()

    def report_partial_pass(self) -> None:
        """The data summary line of a run that ended before its first pass did (once, if anything was cut)."""
        with self._lock:
            report, self.report = self.report, False
            seen = min(self.records_seen, self.num_records)
        if report:
            self.stats.log_summary(logger, f"{seen} of {self.num_records} training records read",
                                   self.cfg.truncation, max(self.cfg.resolved_buckets))

    def _skip(self, error: Exception) -> None:
        if not self.cfg.skip_bad_rows:
            raise error
        with self._lock:
            self.skipped += 1
        logger.warning("skipping bad row: %s", error)

    def __call__(self, window_index: int, window: Sequence[Any]) -> list[dict]:
        cfg = self.cfg
        groups = []
        for rec in window:
            try:
                if isinstance(rec, _BadRow):
                    raise rec.error
                if cfg.stage == "sft" and not isinstance(rec, SFTRecord):
                    raise TypeError(f"stage 'sft' needs SFT records, got {type(rec).__name__}")
                if cfg.stage != "sft" and not isinstance(rec, PreferenceRecord):
                    raise TypeError(f"stage {cfg.stage!r} needs preference records, got {type(rec).__name__}")
                reject_seed = cfg.seed if cfg.reject_selection == "random" else None
                groups.append(self.tok.tokenize(rec, cfg.num_rejects, self.truncation, self.stats, reject_seed))
            except DataError as e:
                self._skip(e)
        batches = pack_batches(groups, cfg.resolved_buckets, cfg.batch_size, cfg.group_size, self.tok.pad_id,
                               self.tok.eos_id, cfg.truncation, self.stats, cfg.slotted, cfg.groups_per_row)
        with self._lock:
            self.records_seen += len(window)
            self.batches_made += len(batches)
            if not self.batches_made and self.records_seen >= self.num_records:
                self.report = False  # the error below carries the counts
                counts = dict(self.stats.as_dict(), skipped_rows=self.skipped)
                reasons = "counted so far: " + (", ".join(f"{k} {v}" for k, v in counts.items() if v) or "nothing")
                raise NoTrainableDataError(
                    f"a whole pass over the {self.num_records} training records gave no batch to train on "
                    f"({reasons}; data.truncation {cfg.truncation!r}, rows of {max(cfg.resolved_buckets)} tokens): "
                    + no_batch_advice(counts, cfg.truncation))
            report = self.report and self.records_seen >= self.num_records
            if report:
                self.report = False
        if report:
            self.stats.log_summary(logger, f"first pass over {self.num_records} training records",
                                   cfg.truncation, max(cfg.resolved_buckets))
        order = np.random.default_rng([cfg.seed, window_index, 7]).permutation(len(batches))
        return [batches[i] for i in order]


class _ProcessRows(grain.experimental.FlatMapTransform):
    """Flatten a window's batches, keeping this process's rows of each global batch."""

    max_fan_out = 1 << 30

    def __init__(self, cfg: PipelineConfig):
        self._lo = cfg.process_index * cfg.rows_per_process
        self._hi = self._lo + cfg.rows_per_process

    def flat_map(self, batches: list[dict]) -> list[dict]:
        return [{k: v[self._lo:self._hi] for k, v in b.items()} for b in batches]


# Fields renamed to the trainer's names, fingerprinted under their first names: iterator states saved before the
# rename still restore.
_FINGERPRINT_NAMES = {"seq_len": "sample_max_length", "worker_count": "num_threads"}


def _fingerprint(cfg: PipelineConfig, num_records: int) -> str:
    # process_index is left out: every host's state is the same, so any host's saved state restores any host.
    fields = {_FINGERPRINT_NAMES.get(k, k): v for k, v in dataclasses.asdict(cfg).items() if k != "process_index"}
    # The window actually used: states saved with the former fixed default (256) still restore where the
    # automatic window is also 256.
    fields["window_groups"] = cfg.resolved_window_groups
    blob = json.dumps([fields, num_records], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class TrainIterator:
    """Iterator of per-process packed batches with exact `get_state` / `set_state` (see module docstring)."""

    def __init__(self, records, tokenizer: ChatTokenizer, cfg: PipelineConfig, *, report: bool = True):
        """``report``: log the data summary line (what truncation and packing did) after the first pass."""
        if len(records) == 0:
            raise ValueError("no training records")
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.buckets = cfg.resolved_buckets
        self._stats = TruncationStats()
        self._packer = _WindowPacker(tokenizer, cfg, self._stats, len(records), report)
        self._fingerprint = _fingerprint(cfg, len(records))
        ds = grain.MapDataset.source(_SafeSource(records))
        if cfg.shuffle:
            ds = ds.shuffle(seed=cfg.seed)
        ds = ds.repeat(cfg.num_epochs)
        ds = ds.batch(cfg.resolved_window_groups, batch_fn=list)
        ds = ds.map_with_index(self._packer)
        read = grain.ReadOptions(num_threads=cfg.worker_count, prefetch_buffer_size=max(1, cfg.worker_count))
        it_ds = grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(read), _ProcessRows(cfg))
        if cfg.prefetch > 0:
            it_ds = grain.experimental.ThreadPrefetchIterDataset(it_ds, prefetch_buffer_size=cfg.prefetch)
        self._dataset = it_ds
        self._iter = iter(it_ds)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self._iter is None:
            raise ValueError("the data iterator is closed")
        return next(self._iter)

    def get_state(self) -> dict:
        return {"version": STATE_VERSION, "fingerprint": self._fingerprint, "grain": self._iter.get_state()}

    def set_state(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"data iterator state version {state.get('version')} != {STATE_VERSION}")
        if state.get("fingerprint") != self._fingerprint:
            raise ValueError("data iterator state was saved with different pipeline arguments or data "
                             f"(fingerprint {state.get('fingerprint')} != {self._fingerprint})")
        self._iter.set_state(state["grain"])

    def batch_spec(self, length: int | None = None) -> dict:
        """{name: (shape, dtype)} of this process's batches of row length `length` (default: largest)."""
        return batch_spec(self.cfg.rows_per_process, length or max(self.buckets))

    def stats(self) -> dict[str, int]:
        return dict(self._stats.as_dict(), skipped_rows=self._packer.skipped)

    def close(self) -> None:
        """Stop the prefetch threads. Dropping the iterators here (not at interpreter exit) keeps grain's
        `__del__` from running when its modules are already torn down."""
        if self._iter is None:
            return
        self._packer.report_partial_pass()
        self._iter.close()
        self._iter = None
        self._dataset = None
        gc.collect()


def make_train_iterator(data, tokenizer, *, stage: str = "simpo", data_format: str | None = None,
                        split: str | None = None, enable_thinking: bool | None = None,
                        process_index: int | None = None, process_count: int | None = None,
                        report: bool = True, **config: Any) -> TrainIterator:
    """Build the training iterator (arguments: `PipelineConfig` fields; see the module docstring).

    `process_index` / `process_count` default to `jax.process_index()` / `jax.process_count()`.
    `data_format` (for a path): "auto" (default), "sft" or "preference".
    `enable_thinking` (for a tokenizer directory): None renders the chat template without the variable, as
    upstream training does (Qwen3: the empty think block opens the response and is trained); False moves it
    into the masked prompt.
    """
    if process_index is None or process_count is None:
        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    cfg = PipelineConfig(stage=stage, process_index=process_index, process_count=process_count, **config)
    if not isinstance(tokenizer, ChatTokenizer):
        tokenizer = ChatTokenizer.from_dir(str(tokenizer), enable_thinking=enable_thinking)
    if isinstance(data, (str, bytes)) or hasattr(data, "__fspath__"):
        data = RecordSource(data, data_format or "auto", split, skip_bad_rows=cfg.skip_bad_rows)
    expected = "sft" if stage == "sft" else "preference"
    if isinstance(data, RecordSource) and data.format != expected:
        raise ValueError(f"{data.source_name}: stage {stage!r} needs {expected} data, the file holds "
                         f"{data.format} rows")
    return TrainIterator(data, tokenizer, cfg, report=report)


def no_batch_advice(counts: dict, truncation: str) -> str:
    """What to change when a whole pass gave no batch, from what the pass counted: no advice to set what is
    already set, and identical pairs that no cut made are the data's own."""
    inspect = "check the data (python -m longrm_jax.data.inspect_data)"
    if counts.get("identical_pairs_dropped") and not counts.get("truncated_samples"):
        return ("every preference group's rejected response equals its chosen one although no sequence was cut: "
                "the data's pairs do not differ; " + inspect)
    fixes = ["raise data.seq_len"] + (["use data.truncation prompt_middle"] if truncation != "prompt_middle" else [])
    return ", ".join(fixes) + ", or " + inspect
