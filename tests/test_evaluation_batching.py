"""Length buckets fitted to a run's lengths (``evaluation.batching.fit_buckets``)."""

import numpy as np

from longrm_jax.data.packing import bucket_for
from longrm_jax.evaluation.batching import bucket_lengths, fit_buckets


def _flops(length):  # an 8B model's prefill: matmuls plus causal attention
    return 2 * 7e9 * length + 2 * 32 * 4096 * float(length) ** 2


def _brute_force(lengths, cost, new_bucket_cost, multiple):
    """Best total over every set of rounded lengths that includes the longest (small inputs only)."""
    rounded = sorted({-(-n // multiple) * multiple for n in lengths})
    best = None
    for mask in range(1 << (len(rounded) - 1)):
        chosen = [r for i, r in enumerate(rounded[:-1]) if mask >> i & 1] + [rounded[-1]]
        total = sum(cost(bucket_for(n, chosen)) for n in lengths) + new_bucket_cost * len(chosen)
        best = total if best is None else min(best, total)
    return best


def _total(lengths, buckets, cost, new_bucket_cost, ready=()):
    return sum(cost(bucket_for(n, buckets)) for n in lengths) + new_bucket_cost * len(set(buckets) - set(ready))


def test_clustered_lengths_get_one_tight_bucket_each():
    # The synthetic benchmark's prompts: a template's few dozen tokens above each context size.
    lengths = [4127, 4131, 4126, 8228, 8232, 16419, 32802, 65572, 131104, 131107]
    buckets = fit_buckets(lengths, _flops, new_bucket_cost=4e15 / 64, multiple=128)
    assert buckets == [4224, 8320, 16512, 32896, 65664, 131200]
    # The fixed ladder pads 131,107 tokens to 196,608: 2.2x the attention work.
    assert bucket_for(131107, bucket_lengths(131107)) == 196608


def test_fit_is_optimal_and_prices_compiles():
    rng = np.random.default_rng(0)
    for trial in range(20):
        lengths = rng.integers(100, 5000, int(rng.integers(1, 9))).tolist()
        cost = (lambda n: n) if trial % 2 else (lambda n: n + n * n / 3000)
        for new_bucket_cost in (0.0, 500.0, 5e3, 1e9):
            buckets = fit_buckets(lengths, cost, new_bucket_cost=new_bucket_cost, multiple=64)
            assert all(b % 64 == 0 for b in buckets) and max(buckets) >= max(lengths)
            assert np.isclose(_total(lengths, buckets, cost, new_bucket_cost),
                              _brute_force(lengths, cost, new_bucket_cost, 64))
    assert fit_buckets([10, 20, 300], lambda n: n, new_bucket_cost=1e9) == [384]  # compiles dominate: one
    assert fit_buckets([10, 20, 300], lambda n: n, new_bucket_cost=0, multiple=32) == [32, 320]
    assert fit_buckets([], lambda n: n, new_bucket_cost=1.0) == []


def test_compiled_buckets_are_free():
    # A bucket compiled for an earlier task file serves these lengths without a compile...
    assert fit_buckets([100, 200], lambda n: n, new_bucket_cost=1e9, ready=[256]) == [256]
    # ... unless padding to it costs more than compiling a tighter one.
    assert fit_buckets([100, 200], lambda n: n, new_bucket_cost=200, ready=[4096]) == [256]
    # Ready buckets smaller than every length are ignored.
    assert fit_buckets([1000], lambda n: n, new_bucket_cost=1.0, ready=[128]) == [1024]
