"""Splash's block tables built by ``ops.splash_tables`` equal jax's own (``process_mask`` / ``process_mask_dkv``,
which materialize the dense mask): every array, dtype included, for causal and full masks, square and not, with
equal and unequal blocks. Packed documents do not enter the tables (segment ids reach the kernel at run time);
tests/test_ops_splash.py runs the kernel on these tables with packed segments in the Pallas interpreter."""

import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as smi

from longrm_jax.ops.splash_tables import mask_info


def _jax_tables(t, s, block_shape, causal, dkv, heads=4):
    mask = sm.MultiHeadMask([sm.CausalMask((t, s)) if causal else sm.FullMask((t, s))] * heads)
    if dkv:
        return smi.process_mask_dkv(mask, block_shape, head_shards=1, q_seq_shards=1, shrink_grid=True)
    return smi.process_mask(mask, block_shape, head_shards=1, q_seq_shards=1)


@pytest.mark.parametrize("t,s,block_shape,causal", [
    (128, 128, (128, 128), True),     # one block
    (1024, 1024, (128, 128), True),   # 8 x 8 blocks
    (1536, 1536, (512, 512), True),
    (1024, 1024, (128, 256), True),   # unequal blocks: partial blocks off the diagonal
    (1024, 1024, (256, 128), True),
    (640, 384, (128, 128), False),    # ring blocks off the diagonal: full, T != S
    (1024, 512, (256, 512), False),
])
@pytest.mark.parametrize("dkv", [False, True])
def test_tables_equal_jax(t, s, block_shape, causal, dkv):
    want, want_fn = _jax_tables(t, s, block_shape, causal, dkv)
    got, got_fn = mask_info(t, s, block_shape, causal, dkv)
    for field in want._fields:
        a, b = getattr(got, field), getattr(want, field)
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, field
            np.testing.assert_array_equal(a, b, err_msg=field)
        else:
            assert a == b, field
    assert (got_fn is None) == (want_fn is None)
    if want_fn is not None:
        q, k = np.arange(t)[:, None], np.arange(s)[None, :]
        np.testing.assert_array_equal(got_fn(q, k), want_fn(q, k))


def test_tables_for_a_million_tokens_are_quick():
    """1M x 1M causal in 512-token blocks: 2,048 x 2,048 blocks (jax's builder would scan 10^12 mask entries)."""
    import time

    start = time.process_time()
    info, _ = mask_info(2**20, 2**20, (512, 512), True, True)
    assert time.process_time() - start < 10
    # dkv tables, per key column bottom-aligned: the last key block is seen by the last query block only
    assert info.block_mask.shape == (1, 2048, 2048) and list(info.block_mask[0, -2:, -1]) == [0, 1]
