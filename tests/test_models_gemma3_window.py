"""Sliding windows in the attention contract (issue 43, for Gemma 3's local layers): XLA's blockwise attention
honours ``window`` (forward and gradients equal the dense reference, packed rows and GQA included) and skips key
blocks wholly outside it; TPU splash honours it with its LocalMask (tables equal jax's; the kernel in the Pallas
interpreter equals the reference); ring attention on 8 fake CPU devices honours it on XLA blocks (zigzag or
contiguous shards, gradients included) and computes only the block pairs the window reaches; every kernel that
does not honour a window refuses it, never attending over the whole sequence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax.ops import attention
from longrm_jax.ops.attention import dense_reference
from longrm_jax.ops.contract import AttentionNotSupportedError
from longrm_jax.ops.ring import ring_attention
from longrm_jax.ops.ring_window import computed_blocks
from longrm_jax.ops.xla_attention import _block_skipped, xla_attention_with_lse
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.parallel.zigzag import zigzag_reorder, zigzag_restore


def _qkv(t=60, hq=4, hkv=2, d=16, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (2, t, hq, d), jnp.float32)
    k = jax.random.normal(keys[1], (2, t, hkv, d), jnp.float32)
    v = jax.random.normal(keys[2], (2, t, hkv, d), jnp.float32)
    return q, k, v


@pytest.mark.parametrize("window", [1, 7])
def test_xla_window_matches_dense_forward_and_gradients(window):
    q, k, v = _qkv()
    seg = jnp.asarray(np.repeat([[1] * 25 + [2] * 30 + [0] * 5], 2, axis=0), jnp.int32)

    def ours(q, k, v):  # blocks of 8 over 60 tokens: a partial last block, blocks outside the window skipped
        out, _ = xla_attention_with_lse(q, k, v, q_segment_ids=seg, kv_segment_ids=seg, block_q=8, block_k=8,
                                        window=window, scale=0.3)
        return out

    def ref(q, k, v):
        return dense_reference(q, k, v, segment_ids=seg, window=window, scale=0.3)

    np.testing.assert_allclose(ours(q, k, v), ref(q, k, v), rtol=1e-5, atol=1e-5)
    cot = jax.random.normal(jax.random.key(9), q.shape)
    g_ours = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a) * cot), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g_ours, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    # The entry point with impl="auto" takes the same path on one device.
    np.testing.assert_allclose(attention(q, k, v, segment_ids=seg, window=window, scale=0.3), ref(q, k, v),
                               rtol=1e-5, atol=1e-5)


def test_window_reaches_exactly_window_keys_back():
    """Query i sees keys i - window + 1 ... i (HF's sliding_window): a value only key 0 carries reaches query
    window - 1, not query window."""
    t, window = 12, 5
    q = jnp.zeros((1, t, 1, 4))
    k = jnp.zeros((1, t, 1, 4))
    v = jnp.zeros((1, t, 1, 4)).at[0, 0, 0, 0].set(1.0)
    out = attention(q, k, v, window=window)[0, :, 0, 0]
    assert out[window - 1] > 0 and np.all(np.asarray(out[window:]) == 0)


def test_blocks_outside_the_window_are_skipped():
    q_pos, window = jnp.arange(32, 40), 8
    assert bool(_block_skipped(q_pos, jnp.arange(0, 8), True, window))  # keys 0-7: all <= 32 - 8
    assert not bool(_block_skipped(q_pos, jnp.arange(24, 32), True, window))  # key 31 is in query 32's window
    assert bool(_block_skipped(q_pos, jnp.arange(16, 24), True, window))  # key 23 <= 32 - 8: hidden from all
    assert not bool(_block_skipped(q_pos, jnp.arange(0, 8), True, None))  # no window: causal only


@pytest.mark.parametrize("impl", ["cudnn", "pallas", "pallas-mosaic", "pallas-triton", "splash"])
def test_kernels_without_window_support_refuse(impl):
    q, k, v = _qkv(t=16)
    if impl not in ("splash", "cudnn"):  # cuDNN takes a window on a GPU (tests/test_ops_cudnn_hybrid.py)
        with pytest.raises(AttentionNotSupportedError, match="does not honour a sliding window"):
            attention(q, k, v, impl=impl, window=4)
    # Ring blocks see global positions: XLA's only (splash's LocalMask is fixed per block).
    with jax.set_mesh(make_mesh(data=1, fsdp=-1, seq=2)), pytest.raises(AttentionNotSupportedError, match="XLA"):
        ring_attention(q, k, v, impl=impl, window=4, interpret=impl == "splash")


@pytest.mark.parametrize("t,block_shape", [(1024, (128, 128)), (1024, (256, 128)), (768, (128, 256))])
@pytest.mark.parametrize("window", [1, 100, 300])
@pytest.mark.parametrize("dkv", [False, True])
def test_splash_window_tables_equal_jax(t, block_shape, window, dkv):
    """Splash's tables for a window (ops.splash_tables) equal jax's process_mask on LocalMask."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as smi
    from longrm_jax.ops.splash_tables import mask_info

    mask = sm.MultiHeadMask([sm.LocalMask((t, t), (window - 1, 0), 0)] * 2)
    process = smi.process_mask_dkv if dkv else smi.process_mask
    kwargs = dict(shrink_grid=True) if dkv else {}
    want, want_fn = process(mask, block_shape, head_shards=1, q_seq_shards=1, **kwargs)
    got, got_fn = mask_info(t, t, block_shape, True, dkv, window=window)
    for field in want._fields:
        a, b = getattr(got, field), getattr(want, field)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, field
            np.testing.assert_array_equal(a, b, err_msg=field)
        else:
            assert a == b, field
    q_ids, kv_ids = np.arange(t)[:, None], np.arange(t)[None, :]
    np.testing.assert_array_equal(got_fn(q_ids, kv_ids), want_fn(q_ids, kv_ids))


def test_splash_window_matches_dense_in_the_interpreter():
    """TPU splash with its LocalMask (Pallas interpreter on CPU): 200 tokens padded to 256 in blocks of 128, a
    window of 70 over packed rows; outputs and gradients equal the dense reference."""
    q, k, v = _qkv(t=200)
    seg = jnp.asarray(np.repeat([[1] * 90 + [2] * 100 + [0] * 10], 2, axis=0), jnp.int32)
    cot = jax.random.normal(jax.random.key(3), q.shape)

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(fn(*a) * cot), argnums=(0, 1, 2)))(q, k, v)

    (got, got_grads) = loss(lambda *a: attention(*a, segment_ids=seg, window=70, impl="splash", interpret=True))
    (want, want_grads) = loss(lambda *a: dense_reference(*a, segment_ids=seg, window=70))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(got_grads, want_grads):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mesh_sizes,zigzag,window", [
    (dict(data=2, fsdp=1, seq=4), True, 6),  # zigzag chunks of 8 tokens: a window over two chunks
    (dict(data=1, fsdp=1, seq=8), False, 11),  # contiguous shards of 8 tokens: over three
])
def test_ring_with_window_matches_one_device(mesh_sizes, zigzag, window):
    q, k, v = _qkv(t=64)
    seg = jnp.asarray(np.repeat([[1] * 30 + [2] * 30 + [0] * 4], 2, axis=0), jnp.int32)
    cot = jax.random.normal(jax.random.key(8), q.shape)
    mesh = make_mesh(**mesh_sizes)
    n = mesh.shape["seq"]
    order = (lambda x: zigzag_reorder(x, n)) if zigzag else (lambda x: x)
    undo = (lambda x: zigzag_restore(x, n)) if zigzag else (lambda x: x)

    def ring(q, k, v):
        if zigzag:  # the model's path: impl="auto" under a seq mesh
            return attention(q, k, v, segment_ids=order(seg), window=window)
        return ring_attention(q, k, v, segment_ids=seg, window=window, zigzag=False)

    def step(q, k, v, cot):
        out, vjp = jax.vjp(ring, q, k, v)
        return out, vjp(cot)

    with jax.set_mesh(mesh):
        out, grads = jax.jit(step)(*(order(x) for x in (q, k, v, cot)))

    def ref(q, k, v):
        return dense_reference(q, k, v, segment_ids=seg, window=window)

    np.testing.assert_allclose(undo(out), ref(q, k, v), rtol=1e-5, atol=1e-5)
    want = jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(undo(g), w, rtol=1e-4, atol=1e-4)


def test_ring_computes_only_the_blocks_the_window_reaches():
    """8 devices, 128 tokens in zigzag chunks of 8 (XLA blocks of 8): of 256 block pairs a causal ring computes
    the 136 on or below the diagonal, a window of 8 only 31 (each block and the one before it, but the first),
    counted with XLA attention's own skip test on the positions the ring passes it."""
    assert computed_blocks(8, 16, True, window=None) == 16 * 17 // 2
    assert computed_blocks(8, 16, True, window=8) == 16 + 15
    assert computed_blocks(8, 16, True, window=1) == 16
    assert computed_blocks(4, 32, False, window=40) == 4 + 3 + 2  # contiguous blocks of 32: two back at most
