"""Pairs (SFT: samples) per optimizer step of a training config on its data, next to upstream's scripts'.

    python scripts/pairs_per_step.py --config configs/qwen3_8b_grm_simpo.yaml \
        --set data.tokenizer=checkpoints/Qwen3-8B --set data.source=data/longrm/SimPO_Data:train

* Ours: one dry epoch of the training pipeline itself (``training.data_source.train_iterator``, the config's
  shuffle and packing): the groups of each global batch (one optimizer step).
* Upstream (docs/upstream.md "Pairs per optimizer step"), for each ``--upstream-batch-size`` (its shipped
  scripts pass 2, its default is 16): SFT trains one sample per micro step, ``batch_size`` per step. SimPO / BT
  bucket the groups: in a ``random.seed(seed)`` shuffle, groups fill a bucket in turn while the sum of their
  prompt + longest response stays within ``--bucket-size`` (128,000); the last partial bucket is dropped; the
  buckets are shuffled by ``torch.randperm`` (seed + epoch) and ``batch_size`` of them make a step, the steps
  being ``buckets // batch_size``. Written here from that description, on our tokenization of the same rows.

Prints one line per setting: steps per epoch, pairs per step (mean, min, max) and pairs trained.
"""

from __future__ import annotations

import argparse
import random
import sys

import numpy as np


def ours(cfg, tokenizer, records) -> list[int]:
    """Groups per optimizer step over one epoch of the training pipeline."""
    from longrm_jax.training.data_source import train_iterator

    it = train_iterator(cfg, tokenizer, records, num_epochs=1)
    try:
        return [int(np.asarray(batch["num_groups"]).sum()) for batch in it]
    finally:
        it.close()


def upstream_buckets(keys: list[int], bucket_size: int, seed: int) -> list[list[int]]:
    """Upstream's buckets of group indices (the last partial one dropped, as its code does)."""
    order = list(enumerate(keys))
    random.Random(seed).shuffle(order)  # random.seed(seed); random.shuffle(...)
    buckets, current, size = [], [], 0
    for index, key in order:
        if size + key > bucket_size:
            buckets.append(current)
            current, size = [index], key
        else:
            current.append(index)
            size += key
    return buckets  # `current` is never appended: the last bucket is lost


def upstream_steps(keys: list[int], sft: bool, batch_size: int, bucket_size: int, seed: int) -> list[int]:
    """Groups per optimizer step of upstream's trainer with ``batch_size`` over one epoch."""
    if sft:
        return [batch_size] * (len(keys) // batch_size)
    buckets = upstream_buckets(keys, bucket_size, seed)
    try:
        import torch

        generator = torch.Generator()
        generator.manual_seed(seed)  # DistributedBucketSampler: seed + epoch, epoch 0
        buckets = [buckets[i] for i in torch.randperm(len(buckets), generator=generator).tolist()]
    except ImportError:  # without torch the step sums follow the unshuffled bucket order (counts are the same)
        pass
    steps = len(buckets) // batch_size
    return [sum(len(b) for b in buckets[s * batch_size:(s + 1) * batch_size]) for s in range(steps)]


def describe(name: str, per_step: list[int], total: int) -> str:
    if not per_step:
        return f"{name}: no optimizer step (fewer than one step's worth of data)"
    return (f"{name}: {len(per_step)} steps per epoch, pairs per step mean {np.mean(per_step):.2f} (min {min(per_step)}, "
            f"max {max(per_step)}), {sum(per_step)} of {total} trained")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--upstream-batch-size", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--bucket-size", type=int, default=128_000)
    parser.add_argument("--upstream-seed", type=int, default=42)
    args = parser.parse_args(argv)

    from longrm_jax.data.tokenize import TruncationConfig
    from longrm_jax.training.config import load_config
    from longrm_jax.training.data_source import load_tokenizer, train_records

    cfg = load_config(args.config, args.overrides)
    tokenizer = load_tokenizer(cfg.data)
    records = list(train_records(cfg))
    sft = cfg.stage == "sft"
    per_step = ours(cfg, tokenizer, records)
    print(describe(f"ours ({args.config}, {' '.join(args.overrides) or 'as shipped'})", per_step, len(records)))
    cut = TruncationConfig(policy="right", max_length=args.bucket_size)  # upstream cuts each sequence at 128,000
    keys = []
    for record in records:
        group = tokenizer.tokenize(record, num_rejects=max(cfg.data.num_rejects, 1), truncation=cut)
        prompt = group.samples[0].prompt_len
        keys.append(prompt + max(len(s) - s.prompt_len for s in group.samples))
    for batch_size in args.upstream_batch_size:
        steps = upstream_steps(keys, sft, batch_size, args.bucket_size, args.upstream_seed)
        print(describe(f"upstream batch_size {batch_size}", steps, len(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
