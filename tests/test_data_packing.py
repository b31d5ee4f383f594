"""Packing: hypothesis properties (groups never split, rows within length, segments/positions consistent, no
token lost except by declared truncation) and the batch contract of docs/design.md."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longrm_jax.data.packing import (bucket_for, drop_untrainable, fit_group, make_buckets, own_row_length,
                                     pack_batches, unpack_row)
from longrm_jax.data.records import DataError, Provenance
from longrm_jax.data.tokenize import TokenizedGroup, TokenizedSample, TruncationStats

PAD, EOS = 0, 1


def _sample(rng, n, prompt_len):
    ids = rng.integers(2, 1000, size=n).astype(np.int32)
    mask = np.zeros(n, np.int32)
    mask[prompt_len:] = 1
    mask[-1] = 1
    ids[-1] = EOS
    return TokenizedSample(ids, mask, prompt_len)


@st.composite
def groups_strategy(draw):
    group_size = draw(st.integers(1, 3))
    n_groups = draw(st.integers(1, 24))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        samples = []
        for _ in range(group_size):
            n = draw(st.integers(2, 160))
            samples.append(_sample(rng, n, draw(st.integers(0, n - 1))))
        groups.append(TokenizedGroup(tuple(samples), Provenance("mem", g)))
    return group_size, groups


def _key(s):
    return (tuple(s.input_ids.tolist()), tuple(s.loss_mask.tolist()))


@settings(max_examples=60, deadline=None)
@given(groups_strategy(), st.integers(1, 4), st.sampled_from([(32, 64, 128, 256), (64, 128), (256,)]))
def test_packing_properties(gs_groups, batch_rows, buckets):
    group_size, groups = gs_groups
    stats = TruncationStats()
    capacity = max(buckets)
    batches = pack_batches(groups, buckets, batch_rows, group_size, PAD, EOS, "right", stats)
    fitted = drop_untrainable([fit_group(g, capacity, "right", EOS) for g in groups])
    expected = sorted(tuple(_key(s) for s in g.samples) for g in fitted)
    found = []
    for batch in batches:
        b, t = batch["input_ids"].shape
        assert b == batch_rows and (t in buckets or t == own_row_length(capacity, group_size))
        assert set(batch) == {"input_ids", "positions", "segment_ids", "loss_mask", "num_groups"}
        assert all(v.dtype == np.int32 for v in batch.values())
        for r in range(b):
            seg, pos = batch["segment_ids"][r], batch["positions"][r]
            n_seg = int(seg.max(initial=0))
            assert n_seg == batch["num_groups"][r] * group_size  # whole groups only
            valid = seg > 0
            # contiguous: segments 1..n in order, then padding only
            assert np.all(valid[:valid.sum()]) and np.all(np.diff(seg[valid]) >= 0)
            assert np.all(batch["input_ids"][r][~valid] == PAD) and np.all(batch["loss_mask"][r][~valid] == 0)
            assert np.all(pos[~valid] == 0)
            for s in range(1, n_seg + 1):
                idx = np.nonzero(seg == s)[0]
                assert np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx)))  # contiguous
                assert np.array_equal(pos[idx], np.arange(len(idx)))  # positions restart per sample
            samples = unpack_row(batch, r)
            for g in range(len(samples) // group_size):
                found.append(tuple((tuple(i.tolist()), tuple(m.tolist()))
                                   for i, m in samples[g * group_size:(g + 1) * group_size]))
    # every group exactly once, intact (chosen first) -> nothing lost beyond fit_group's declared cut
    assert sorted(found) == expected
    cut = [g for g in groups if max(len(s) for s in g.samples) > capacity]
    lost = sum(g.num_tokens for g in cut) - sum(len(s) for g in cut for s in fit_group(g, capacity, "right",
                                                                                     EOS).samples)
    assert stats.as_dict()["dropped_tokens"] == lost
    assert (lost > 0) == bool(cut)  # only samples longer than the row lose tokens; a pair is never cut as a whole


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(2, 400), min_size=1, max_size=4), st.integers(16, 300),
       st.sampled_from(["right", "prompt_middle"]))
def test_fit_group_cuts_each_sample_on_its_own(lengths, capacity, policy):
    rng = np.random.default_rng(0)
    group = TokenizedGroup(tuple(_sample(rng, n, n // 2) for n in lengths), Provenance("mem", 0))
    out = fit_group(group, capacity, policy, EOS)
    for before, after in zip(group.samples, out.samples):
        if len(before) <= capacity:
            assert after is before  # a sample that fits is never touched, whatever its group's total
            continue
        assert len(after) == capacity and after.truncated
        assert after.input_ids[-1] == EOS and after.loss_mask[-1] == 1
        if policy == "right":
            assert np.array_equal(after.input_ids[:-1], before.input_ids[:capacity - 1])
        else:  # the response is kept whole when the prompt can give way (it keeps >= capacity // 8)
            response = before.input_ids[before.prompt_len:]
            if len(response) <= capacity - min(before.prompt_len, capacity // 8):
                assert np.array_equal(after.input_ids[after.prompt_len:], response)
                assert after.loss_mask.sum() == before.loss_mask.sum()


def test_error_policy_names_row():
    rng = np.random.default_rng(0)
    group = TokenizedGroup((_sample(rng, 200, 10), _sample(rng, 100, 10)), Provenance("f.jsonl", 6, 7))
    with pytest.raises(DataError, match=r"f.jsonl: line 7: sample of 200 tokens is longer than the row length 128"):
        pack_batches([group], (128,), 1, 2, PAD, EOS, "error")


def test_long_pair_gets_a_row_of_its_own_and_identical_pairs_are_dropped(caplog):
    """A pair longer than the row is never cut as a whole: it gets an own row of (1 + R) x row length, each
    sample whole; a pair with chosen == rejected is dropped, logged and counted."""
    rng = np.random.default_rng(3)
    long_pair = TokenizedGroup((_sample(rng, 100, 60), _sample(rng, 90, 60)), Provenance("m", 0))
    short_pair = TokenizedGroup((_sample(rng, 20, 5), _sample(rng, 30, 5)), Provenance("m", 1))
    same = _sample(rng, 20, 5)
    identical = TokenizedGroup((same, same), Provenance("m", 2))
    stats = TruncationStats()
    batches = pack_batches([long_pair, short_pair, identical], (128,), 1, 2, PAD, EOS, stats=stats)
    assert sorted(b["input_ids"].shape[1] for b in batches) == [128, 256]
    (own,) = [b for b in batches if b["input_ids"].shape[1] == 256]
    samples = unpack_row(own, 0)
    assert [len(i) for i, _ in samples] == [100, 90]
    assert np.array_equal(samples[0][0], long_pair.samples[0].input_ids)
    counts = stats.as_dict()
    assert counts["own_row_groups"] == 1 and counts["identical_pairs_dropped"] == 1
    assert counts["dropped_tokens"] == 0 and sum(int(b["num_groups"].sum()) for b in batches) == 2
    assert "m row 2: chosen and rejected are identical" in caplog.text


def test_preference_segment_layout():
    """Group g holds segments g*(1+R)+1 .. g*(1+R)+1+R, chosen first (design.md)."""
    rng = np.random.default_rng(1)
    groups = [TokenizedGroup(tuple(_sample(rng, 10 + g, 3) for _ in range(3)), Provenance("m", g))
              for g in range(4)]
    (batch,) = pack_batches(groups, (256,), 1, 3, PAD, EOS)
    seg = batch["segment_ids"][0]
    assert batch["num_groups"].tolist() == [4] and seg.max() == 12
    for s in range(1, 13):
        group, member = (s - 1) // 3, (s - 1) % 3
        n = (seg == s).sum()
        assert n == 10 + group  # groups stay in input order within a row, members contiguous
        assert np.array_equal(batch["input_ids"][0][seg == s], groups[group].samples[member].input_ids)


def test_buckets_and_empty_rows():
    assert make_buckets(131_072) == (16_384, 32_768, 65_536, 131_072)
    assert make_buckets(1000, 3, 128) == (256, 512, 1024)
    assert bucket_for(300, (256, 512)) == 512
    rng = np.random.default_rng(2)
    groups = [TokenizedGroup((_sample(rng, 50, 5),), Provenance("m", g)) for g in range(3)]
    (batch,) = pack_batches(groups, (64, 128), 4, 1, PAD, EOS)
    # rows of 100 (bucket 128) and 50 (bucket 64) tokens: the lone 64-row moves up, then 2 empty rows
    assert batch["input_ids"].shape == (4, 128)
    assert sorted(batch["num_groups"].tolist()) == [0, 0, 1, 2]


def test_slotted_rows_one_group_per_row_in_equal_slots():
    """Slotted rows ("rows" layout): sample r of a group starts at r * T / k, positions restart, pads between."""
    rng = np.random.default_rng(2)
    groups = [TokenizedGroup(tuple(_sample(rng, n, 3) for n in lens), Provenance("m", g))
              for g, lens in enumerate([(50, 20, 30), (10, 12, 9), (64, 64, 1)])]
    batches = pack_batches(groups, (96, 192), 1, 3, PAD, EOS, slotted=True)
    rows = [(b, r) for b in batches for r in range(b["input_ids"].shape[0]) if b["num_groups"][r]]
    assert len(rows) == 3  # one group per row, though two would fit one packed row
    for batch, r in rows:
        t = batch["input_ids"].shape[1]
        slot = t // 3
        group = next(g for g in groups if np.array_equal(batch["input_ids"][r, :len(g.samples[0])],
                                                         g.samples[0].input_ids))
        assert t == (96 if max(len(s) for s in group.samples) <= 32 else 192)  # cost k * longest sample
        for m, s in enumerate(group.samples):
            n = len(s)
            assert np.array_equal(batch["input_ids"][r, m * slot:m * slot + n], s.input_ids)
            assert np.array_equal(batch["positions"][r, m * slot:m * slot + n], np.arange(n))
            assert (batch["segment_ids"][r, m * slot:m * slot + n] == m + 1).all()
            assert (batch["segment_ids"][r, m * slot + n:(m + 1) * slot] == 0).all()
            assert (batch["input_ids"][r, m * slot + n:(m + 1) * slot] == PAD).all()


def test_slotted_rows_cut_samples_to_the_slot():
    rng = np.random.default_rng(3)
    group = TokenizedGroup((_sample(rng, 100, 10), _sample(rng, 20, 10)), Provenance("f.jsonl", 2, 3))
    stats = TruncationStats()
    (batch,) = pack_batches([group], (128,), 1, 2, PAD, EOS, "right", stats, slotted=True)
    chosen = batch["input_ids"][0, :64]
    assert (batch["segment_ids"][0, :64] == 1).all() and chosen[-1] == EOS and batch["loss_mask"][0, 63] == 1
    assert np.array_equal(chosen[:-1], group.samples[0].input_ids[:63])
    assert stats.as_dict()["truncated_samples"] == 1 and stats.as_dict()["dropped_tokens"] == 36
    with pytest.raises(DataError, match=r"f.jsonl: line 3: sample of 100 tokens is longer than the row length 64"):
        pack_batches([group], (128,), 1, 2, PAD, EOS, "error", slotted=True)
    with pytest.raises(ValueError, match="multiples of 3"):
        pack_batches([group], (128,), 1, 3, PAD, EOS, slotted=True)


def test_linear_buckets_bound_the_padding():
    from longrm_jax.data.packing import make_buckets

    assert make_buckets(32768, 16, 128, "linear") == tuple(2048 * k for k in range(1, 17))
    assert make_buckets(32768, 3, 128, "halving") == (8192, 16384, 32768)
    with pytest.raises(ValueError, match="halving or linear"):
        make_buckets(1024, 2, 128, "cubic")
