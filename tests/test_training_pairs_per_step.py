"""Pairs (SFT: samples) per optimizer step against upstream's trainer (issue 32; docs/upstream.md "Pairs per
optimizer step"): ``scripts/pairs_per_step.py``'s model of upstream's bucketing equals upstream's own code
(``train/utils/tools.py`` ``bucketize``, ``DistributedBucketSampler``, ``update_steps_per_epoch``, written here
from it), and ``data.groups_per_row=1`` with ``grad_accum=B`` trains upstream SFT's B samples per step, keeping
the last partial step that upstream drops."""

import math
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import pairs_per_step  # noqa: E402

torch = pytest.importorskip("torch")


def _upstream_bucketize(lengths, bucket_size, seed=42):
    """tools.bucketize(obj, bucket_size, shuffle=True, seed=seed)[1] (drop_exceed False)."""
    indexed = [(i, d) for i, d in enumerate(lengths)]
    random.seed(seed)
    random.shuffle(indexed)
    buckets, indexs = [], []
    tmp_bucket, tmp_index, tmp_size = [], [], 0
    for x in indexed:
        if tmp_size + x[1] > bucket_size:
            buckets += [tmp_bucket]
            indexs += [tmp_index]
            tmp_bucket, tmp_index, tmp_size = [x[1]], [x[0]], x[1]
        else:
            tmp_bucket += [x[1]]
            tmp_index += [x[0]]
            tmp_size += x[1]
    return indexs


def _upstream_pairs_per_step(lengths, batch_size, bucket_size, seed=42):
    """DistributedBucketSampler (1 replica, shuffle, drop_last) then batch_size buckets per optimizer step."""
    buckets = _upstream_bucketize(lengths, bucket_size, seed)
    g = torch.Generator()
    g.manual_seed(seed + 0)
    buckets = [buckets[i] for i in torch.randperm(len(buckets), generator=g).tolist()]
    total_size = math.ceil(len(buckets) / 1) * 1
    steps = total_size // batch_size  # update_steps_per_epoch
    return [sum(len(buckets[k]) for k in range(s * batch_size, (s + 1) * batch_size)) for s in range(steps)]


@pytest.mark.parametrize("batch_size", [2, 16])
def test_bucket_model_equals_upstreams_code(batch_size):
    rng = random.Random(batch_size)
    keys = [rng.randint(14_000, 110_000) for _ in range(300)]  # prompt + longest response, real-row sizes
    expected = _upstream_pairs_per_step(keys, batch_size, 128_000)
    assert pairs_per_step.upstream_steps(keys, False, batch_size, 128_000, 42) == expected
    assert sum(expected) < len(keys)  # the last partial bucket (and the steps' remainder) never trains
    assert pairs_per_step.upstream_steps(keys, True, batch_size, 128_000, 42) == [batch_size] * (300 // batch_size)


def test_one_sample_per_row_gives_upstream_sft_samples_per_step():
    from longrm_jax.train import DEFAULT_CONFIG
    from longrm_jax.training.config import load_config
    from longrm_jax.training.data_source import load_tokenizer, train_records

    overrides = ["stage=sft", "data.num_train=10", "data.shuffle=false", "data.seq_len=256", "data.batch_rows=1",
                 "data.synthetic.lengths=[8,16]"]
    packed = load_config(None, overrides + ["grad_accum=4"], base=DEFAULT_CONFIG)
    tok = load_tokenizer(packed.data)
    records = list(train_records(packed))
    assert pairs_per_step.ours(packed, tok, records)[0] > 4  # several samples share a row otherwise
    cfg = load_config(None, overrides + ["grad_accum=4", "data.groups_per_row=1"], base=DEFAULT_CONFIG)
    ours = pairs_per_step.ours(cfg, tok, records)
    upstream = pairs_per_step.upstream_steps([1] * len(records), True, 4, 128_000, 42)
    assert upstream == [4, 4] and sorted(ours) == [2, 4, 4]  # upstream drops the last 2 samples; we train them
