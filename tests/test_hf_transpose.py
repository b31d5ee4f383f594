"""The tiled transpose used when converting between HF and our layouts equals numpy's."""

import ml_dtypes
import numpy as np
import pytest

from longrm_jax.hf.weights import transpose_2d


@pytest.mark.parametrize("shape", [(3, 5), (1030, 1100), (2048, 600), (129, 8200)])
def test_tiled_transpose_equals_numpy(shape):
    a = np.random.default_rng(0).standard_normal(shape).astype(ml_dtypes.bfloat16)
    out = transpose_2d(a)
    assert out.flags.c_contiguous and out.dtype == a.dtype
    np.testing.assert_array_equal(out.view(np.uint16), np.ascontiguousarray(a.T).view(np.uint16))
