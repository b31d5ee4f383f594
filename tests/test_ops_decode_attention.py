"""The decode-attention kernel over a stacked cache (Pallas interpreter on the CPU) against XLA's formulation,
and a model decoding with it against the XLA path."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from longrm_jax.models import ModelConfig, build_model
from longrm_jax.models.layers import _single_query_attention
from longrm_jax.ops.decode_attention import (decode_attention_supported, decode_block, decode_chunks,
                                             stacked_cache_decode_attention)


def _inputs(layers, batch, slots, kv, g, h, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    k = jax.random.normal(ks[0], (layers, batch, slots, kv, h), jnp.float32).astype(dtype)
    v = jax.random.normal(ks[1], (layers, batch, slots, kv, h), jnp.float32).astype(dtype)
    q = jax.random.normal(ks[2], (batch, kv, g, h), jnp.float32).astype(dtype)
    mask = jax.random.bernoulli(ks[3], 0.7, (batch, slots))
    return q, k, v, mask


# 160 slots in blocks of 16 are 10 blocks: 4 chunks split them 3/3/3/1 and 8 chunks 2/2/2/2/2/0/0/0 (uneven and
# empty chunks); blocks of 32 are 5, one chunk takes them all.
@pytest.mark.parametrize("g,chunks,block_s", [(4, None, None), (1, 4, 16), (8, 1, 32), (3, 8, 16)])
def test_kernel_matches_xla_per_layer(g, chunks, block_s):
    layers, batch, slots, kv, h = 3, 2, 160, 2, 16
    q, k, v, mask = _inputs(layers, batch, slots, kv, g, h, jnp.float32)
    mask = mask.at[1, 40:].set(False)  # a row that fills only part of the cache
    run = jax.jit(lambda q, k, v, i, m: stacked_cache_decode_attention(
        q, k, v, i, m, scale=h**-0.5, block_s=block_s, chunks=chunks, interpret=True))
    for layer in range(layers):  # the layer index is an operand: one compile serves all
        out = run(q, k, v, jnp.int32(layer), mask)
        ref = _single_query_attention(q, k[layer], v[layer], mask, h**-0.5)
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_kernel_bf16_and_empty_row():
    layers, batch, slots, kv, g, h = 2, 3, 128, 2, 4, 32
    q, k, v, mask = _inputs(layers, batch, slots, kv, g, h, jnp.bfloat16, seed=1)
    mask = mask.at[2].set(False)  # a row with nothing to attend: 0, never NaN
    out = stacked_cache_decode_attention(q, k, v, 1, mask, scale=h**-0.5, interpret=True)
    ref = _single_query_attention(q, k[1], v[1], mask, h**-0.5)
    np.testing.assert_allclose(np.asarray(out[:2]), np.asarray(ref[:2]), rtol=2e-2, atol=2e-2)
    assert np.all(np.asarray(out[2]) == 0)


def test_shape_rules():
    assert decode_block(33024) == 64 and decode_block(48) == 16 and decode_block(40) is None
    assert decode_attention_supported(128, 33024) and not decode_attention_supported(96, 33024)
    assert not decode_attention_supported(128, 40)
    # The split of S is a function of the cache alone, not the batch: a row's arithmetic is batch-invariant.
    assert decode_chunks(8, 33024, 64) == 32 and decode_chunks(8, 256, 64) == 4
    with pytest.raises(ValueError, match="multiple of block_s"):
        stacked_cache_decode_attention(*_inputs(1, 1, 40, 1, 1, 16, jnp.float32)[:3], 0,
                                       jnp.ones((1, 40), bool), scale=0.25, interpret=True)
    with pytest.raises(ValueError, match="power of two"):
        stacked_cache_decode_attention(*_inputs(1, 1, 64, 1, 1, 16, jnp.float32)[:3], 0,
                                       jnp.ones((1, 64), bool), scale=0.25, chunks=3, interpret=True)


def test_greedy_decode_with_kernel_matches_xla():
    """A tiny model decoding 6 steps after a prefill: same logits with the kernel (interpreted) as with XLA."""
    cfg = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, family="qwen3", qk_norm=True, initializer_range=0.2,
                      pad_token_id=0)
    model = build_model(cfg, rngs=nnx.Rngs(3))
    width, steps = 10, 6
    prompt = np.random.default_rng(0).integers(1, 96, (2, width)).astype(np.int32)
    lengths = np.array([10, 7])
    seg = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)

    def greedy(impl, unroll=False):
        model.use_decode_attention(impl, unroll_layers=unroll)

        @jax.jit
        def run(model, prompt, seg):
            cache = model.init_cache(2, 16)  # 16 slots: the kernel's smallest block
            pos = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (2, width))
            logits, cache = model(prompt * seg, pos, seg, cache=cache, prefill=True)
            token = jnp.argmax(logits[jnp.arange(2), lengths - 1], -1)
            outs = []
            for t in range(steps):
                step, cache = model(token[:, None], jnp.asarray(lengths + t, jnp.int32)[:, None], cache=cache)
                outs.append(step[:, 0])
                token = jnp.argmax(step[:, 0], -1)
            return jnp.stack(outs, 1)

        return np.asarray(run(model, jnp.asarray(prompt), jnp.asarray(seg)))

    ref, out = greedy("xla"), greedy("pallas_interpret")
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert (out.argmax(-1) == ref.argmax(-1)).all()
    # What prepare_for_decoding runs with the kernel: the layer loop unrolled (the layer index a Python int).
    unrolled = greedy("pallas_interpret", unroll=True)
    np.testing.assert_allclose(unrolled, ref, rtol=1e-5, atol=1e-5)
