"""grain pipeline: exact resume, per-process sharding, epochs, bad-row skipping, argument checks."""

import json
from collections import Counter

import numpy as np
import pytest

from longrm_jax.data import synthetic
from longrm_jax.data.packing import unpack_row
from longrm_jax.data.pipeline import make_train_iterator
from longrm_jax.data.records import DataError
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
from longrm_jax.data.tokenize import ChatTokenizer


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("syn")
    synthetic.write_training_files(str(out), num_train=48, num_eval=8, seed=5, lengths=(40, 80, 160))
    return out


@pytest.fixture(scope="module")
def tok():
    return ChatTokenizer.from_dir(TINY_TOKENIZER_DIR)


BASE = dict(stage="simpo", max_length=512, batch_size=2, seed=11, num_epochs=2, window_groups=12,
            num_buckets=3, bucket_multiple=64, process_index=0, process_count=1)


def _make(data, tok, **overrides):
    return make_train_iterator(str(data), tok, **{**BASE, **overrides})


def _drain(it):
    out = list(it)
    it.close()
    return out


def _same(a, b):
    return len(a) == len(b) and all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def _groups(batches, group_size):
    found = Counter()
    for batch in batches:
        for r in range(batch["input_ids"].shape[0]):
            segs = unpack_row(batch, r)
            for g in range(len(segs) // group_size):
                found[tuple(tuple(i.tolist()) for i, _ in segs[g * group_size:(g + 1) * group_size])] += 1
    return found


def test_resume_is_exact(data_dir, tok):
    it = _make(data_dir / "train.jsonl", tok)
    batches, states = [], [it.get_state()]
    for b in it:
        batches.append(b)
        states.append(it.get_state())
    it.close()
    assert len(batches) > 8
    buckets = set(b["input_ids"].shape[1] for b in batches)
    assert buckets <= {128, 256, 512}
    for k in (0, 1, 5, len(batches) // 2, len(batches) - 1, len(batches)):
        restored = _make(data_dir / "train.jsonl", tok)
        restored.set_state(json.loads(json.dumps(states[k])))  # the state survives JSON
        assert _same(_drain(restored), batches[k:]), f"resume at batch {k} differs"


def test_epochs_reshuffle_and_cover_every_group(data_dir, tok):
    batches = _drain(_make(data_dir / "train.jsonl", tok))
    counts = _groups(batches, 2)
    assert len(counts) == 48 and set(counts.values()) == {2}  # every pair exactly once per epoch
    one_epoch = _drain(_make(data_dir / "train.jsonl", tok, num_epochs=1))
    assert sum(b["num_groups"].sum() for b in one_epoch) == 48
    other_seed = _drain(_make(data_dir / "train.jsonl", tok, num_epochs=1, seed=12))
    assert not _same(one_epoch, other_seed)


def test_process_sharding_splits_global_batches(data_dir, tok):
    full = _drain(_make(data_dir / "train.jsonl", tok, batch_size=4))
    parts = [_drain(_make(data_dir / "train.jsonl", tok, batch_size=4, process_index=p, process_count=2))
             for p in range(2)]
    assert len(parts[0]) == len(parts[1]) == len(full)  # same number of steps on every host
    # the state of one host restores another host (the trainer may save process 0's state only)
    it0 = _make(data_dir / "train.jsonl", tok, batch_size=4, process_index=0, process_count=2)
    for _ in range(3):
        next(it0)
    it1 = _make(data_dir / "train.jsonl", tok, batch_size=4, process_index=1, process_count=2)
    it1.set_state(it0.get_state())
    it0.close()
    assert _same(_drain(it1), parts[1][3:])
    for g, p0, p1 in zip(full, *parts):
        assert p0["input_ids"].shape == p1["input_ids"].shape == (2, g["input_ids"].shape[1])
        for k in g:
            assert np.array_equal(np.concatenate([p0[k], p1[k]]), g[k])


def test_sft_stage(data_dir, tok):
    it = _make(data_dir / "sft_train.jsonl", tok, stage="sft", num_epochs=1)
    assert it.batch_spec(128)["input_ids"] == ((2, 128), np.int32)
    batches = _drain(it)
    assert sum(b["num_groups"].sum() for b in batches) == 48
    for b in batches:  # SFT segments are groups of one: segment count == num_groups
        assert np.array_equal(b["segment_ids"].max(axis=1), b["num_groups"])
        assert np.all(b["loss_mask"][b["segment_ids"] == 0] == 0)


def test_bad_rows_error_or_skip(tmp_path, data_dir, tok):
    lines = open(data_dir / "train.jsonl").read().splitlines()[:10]
    lines[4] = json.dumps(dict(json.loads(lines[4]), chosen=" "))
    lines[7] = "{not json"
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl: line (5, field 'chosen': empty response|8: invalid JSON)"):
        _drain(_make(path, tok, shuffle=False, num_epochs=1))
    it = _make(path, tok, num_epochs=1, skip_bad_rows=True)
    batches = _drain(it)
    assert sum(b["num_groups"].sum() for b in batches) == 8
    assert it.stats()["skipped_rows"] == 2 and it.stats()["samples"] == 16


def test_argument_checks(data_dir, tok):
    with pytest.raises(ValueError, match="stage 'sft' needs sft data"):
        _make(data_dir / "train.jsonl", tok, stage="sft")
    with pytest.raises(ValueError, match="not divisible by process_count"):
        _make(data_dir / "train.jsonl", tok, batch_size=3, process_count=2)
    it = _make(data_dir / "train.jsonl", tok)
    state = it.get_state()
    it.close()
    other = _make(data_dir / "train.jsonl", tok, seed=99)
    with pytest.raises(ValueError, match="different pipeline arguments"):
        other.set_state(state)
    other.close()


def test_truncation_counted(data_dir, tok):
    it = _make(data_dir / "train.jsonl", tok, num_epochs=1, max_length=128, num_buckets=1, bucket_multiple=128)
    batches = _drain(it)
    # shared rows of 128, and own rows of 2 x 128 for the pairs too long to share one (never cut as a pair)
    assert {b["input_ids"].shape for b in batches} <= {(2, 128), (2, 256)}
    assert any(b["input_ids"].shape == (2, 256) for b in batches)
    stats = it.stats()
    assert stats["truncated_samples"] > 0 and stats["dropped_tokens"] > 0
    assert stats["prompt_cut_samples"] == stats["truncated_samples"] and stats["own_row_groups"] > 0
    assert stats["identical_pairs_dropped"] == 0
    for batch in batches:  # every pair trains: chosen and rejected differ in every valid group
        for r in range(2):
            segs = unpack_row(batch, r)
            for g in range(len(segs) // 2):
                assert not np.array_equal(segs[2 * g][0], segs[2 * g + 1][0])
    with pytest.raises(DataError, match="truncation policy 'error'"):
        _drain(_make(data_dir / "train.jsonl", tok, max_length=128, num_buckets=1, truncation="error"))


def test_slotted_rows(data_dir, tok):
    """`slotted=True`: every row holds one group, sample r in slot r of row length / group size."""
    batches = _drain(_make(data_dir / "train.jsonl", tok, slotted=True, num_epochs=1))
    seen = 0
    for batch in batches:
        t = batch["input_ids"].shape[1]
        assert t % 128 == 0  # buckets are multiples of bucket_multiple x group size
        for r in range(batch["input_ids"].shape[0]):
            if batch["num_groups"][r]:
                assert batch["num_groups"][r] == 1
                assert batch["segment_ids"][r, 0] == 1 and batch["segment_ids"][r, t // 2] == 2
                seen += 1
    assert seen == 48
    with pytest.raises(ValueError, match="slotted"):
        _make(data_dir / "sft_train.jsonl", tok, stage="sft", slotted=True)


def test_default_window_is_bounded_by_the_row_length():
    """The packing window shrinks with the row length (first-batch latency), never below one batch's rows."""
    from longrm_jax.data.pipeline import PipelineConfig, auto_window_groups

    assert [auto_window_groups(r) for r in (2048, 16384, 32768, 131072, 262144, 1 << 20)] == [256, 256, 128, 32,
                                                                                               16, 8]
    assert auto_window_groups(262144, batch_rows=64) == 64
    assert PipelineConfig(max_length=262144, batch_size=2).resolved_window_groups == 16
    assert PipelineConfig(max_length=262144, batch_size=2, window_groups=100).resolved_window_groups == 100


def test_default_window_at_short_rows_is_the_former_default(data_dir, tok):
    """At rows up to 16K tokens the automatic window is 256 groups, as the former fixed default: same batches, and
    an iterator state saved with window_groups=256 restores into a default iterator."""
    old = _make(data_dir / "train.jsonl", tok, window_groups=256, num_epochs=1)
    first = next(old)
    state = old.get_state()
    rest_old = _drain(old)
    new = _make(data_dir / "train.jsonl", tok, window_groups=None, num_epochs=1)
    assert all(np.array_equal(first[k], v) for k, v in next(new).items())
    new.close()
    resumed = _make(data_dir / "train.jsonl", tok, window_groups=None, num_epochs=1)
    resumed.set_state(state)
    assert _same(_drain(resumed), rest_old)
