"""Decode attention (one query per row) over a layer of a stacked KV cache, as a Pallas Triton kernel.

Why a kernel: a decode step is memory-bound, and at long contexts most of its bytes are the cache (Qwen3-8B at
32K: 4.8 GB of keys and values per token against 16 GB of weights). XLA's formulations stream the cache at a
fraction of the bandwidth (docs/perf_eval.md): reductions at ~0.4 TB/s, cuBLAS batched matmuls with M = 4
query rows per kv head at ~1.1 TB/s. And a kernel fed one layer sliced out of the stacked cache would make XLA
copy that slice first (custom calls take whole buffers). So this kernel takes the whole stacked cache
``[L, B, S, K, H]`` plus the layer index as an operand and computes its own addresses: nothing is copied, the
keys and values are read once, straight from where the decoder's in-place cache update left them.

Work split (flash-decoding): one program per (row, kv head, chunk of S). Each program keeps its kv head's G
query heads (zero-padded to 16 rows, the smallest tensor-core tile) in registers, walks its chunk in blocks of
``block_s`` slots with an online softmax, and writes an unnormalised partial output with its running max and
sum; a few XLA ops combine the chunks. Chunks give the GPU enough programs to stream at full bandwidth when
B x K alone is small (8 programs at batch 1).

Masking is by the cache's per-slot mask ``[B, S]`` (position / segment rule of ``models.cache``): masked slots
are not loaded at all (masked loads issue no memory traffic), so an unfilled cache costs only what is filled.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Query rows per program are padded to this: Triton's tensor-core dot needs at least 16 rows.
_MIN_DOT_ROWS = 16
# Programs to aim for at batch 1: about two per streaming multiprocessor (132 on an H100 / H200). For Qwen3-8B's
# 36 layers at 32K slots, 32 chunks per kv head (256 programs) with 3 pipeline stages are 2% faster than 64 at
# batch 1 and 3% at batch 8 (with 2 stages, 15% slower at batch 1); 16 chunks are 30% slower at batch 1. Fewer
# chunks also mean less to combine (docs/perf_eval.md, "The decode kernel").
_TARGET_PROGRAMS = 256
_NEG = -1e30  # score of a masked slot (finite: exp(_NEG - m) is exactly 0 and never NaN)


def decode_chunks(kv_heads: int, slots: int, block_s: int, target: int = _TARGET_PROGRAMS) -> int:
    """Chunks of the S axis per (row, kv head): a power of two, enough for ``target`` programs at batch 1, each
    chunk at least one block long. Independent of the batch size on purpose: a row's summation order (and so
    its greedy tokens, bit for bit) must not depend on how many rows share the step."""
    want = max(1, -(-target // kv_heads))
    most = max(1, slots // block_s)
    return min(1 << (want - 1).bit_length(), 1 << (most.bit_length() - 1))


def _kernel(layer_ref, q_ref, mask_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, chunk_blocks: int, block_s: int,
            blocks: int, scale: float):
    b, kv, c = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    layer = layer_ref[()]
    q = q_ref[...]  # [G16, H], compute dtype
    rows, head_dim = q.shape
    first = c * chunk_blocks

    def body(j, carry):
        o, m, l = carry
        at = pl.ds((first + j) * block_s, block_s)
        valid = mask_ref[b, at] != 0  # [block_s]
        k = plgpu.load(k_ref.at[layer, b, at, kv, :], mask=valid[:, None], other=0)  # [block_s, H]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        s = jnp.where(valid[None, :], s, _NEG)  # [G16, block_s]
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.where(valid[None, :], jnp.exp(s - m_new[:, None]), 0.0)
        correction = jnp.exp(m - m_new)
        v = plgpu.load(v_ref.at[layer, b, at, kv, :], mask=valid[:, None], other=0)
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
        return correction[:, None] * o + pv, m_new, correction * l + jnp.sum(p, axis=1)

    init = (jnp.zeros((rows, head_dim), jnp.float32), jnp.full((rows,), _NEG, jnp.float32),
            jnp.zeros((rows,), jnp.float32))
    # The last chunk may be shorter (S in blocks need not divide evenly): a per-program trip count.
    trips = jnp.clip(blocks - first, 0, chunk_blocks)
    o, m, l = jax.lax.fori_loop(0, trips, body, init)
    o_ref[...] = o
    m_ref[...] = m
    l_ref[...] = l


def stacked_cache_decode_attention(q_bkgh, k_cache, v_cache, layer, mask_bs, *, scale: float,
                                   block_s: int | None = None, chunks: int | None = None, num_warps: int = 4,
                                   num_stages: int = 3, interpret: bool = False, out_dtype=jnp.float32):
    """Attention of one query per row over layer ``layer`` of a stacked cache.

    q_bkgh [B, K, G, H] (any float dtype; cast to the cache's); k_cache, v_cache [L, B, S, K, H]; layer: int32
    scalar (traced is fine: it is a kernel operand); mask_bs [B, S] bool or int32, true / nonzero where a slot
    may be attended (callers in a layer loop pass it as int32, converted once outside the loop: XLA does not
    hoist the conversion, so converting inside costs a kernel launch per layer). ``chunks`` (default
    :func:`decode_chunks`) must be a power of two: the combine kernel's tile spans them.
    Returns [B, K, G, H] in ``out_dtype``: softmax(q k^T * scale) v over the unmasked slots, 0 for a row with
    none.
    Scores and softmax in float32, probabilities enter the value product in the cache dtype with float32
    accumulation (as the XLA path and HF's attention do).
    """
    b, k_heads, g, h = q_bkgh.shape
    num_layers, _, slots, _, _ = k_cache.shape
    block_s = block_s or decode_block(slots)
    if not decode_attention_supported(h, slots, block_s):
        raise ValueError(f"stacked_cache_decode_attention: head_dim {h} (16..256) and block_s {block_s} must be "
                         f"powers of two and the cache's {slots} slots a multiple of block_s")
    rows = max(_MIN_DOT_ROWS, 1 << (g - 1).bit_length())
    blocks = slots // block_s
    chunks = chunks or decode_chunks(k_heads, slots, block_s)
    if not _power_of_two(chunks):
        raise ValueError(f"stacked_cache_decode_attention: chunks must be a power of two, got {chunks}")
    chunk_blocks = -(-blocks // chunks)
    q = jnp.zeros((b, k_heads, rows, h), k_cache.dtype).at[:, :, :g].set(q_bkgh.astype(k_cache.dtype))
    layer = jnp.asarray(layer, jnp.int32).reshape(())
    if mask_bs.dtype != jnp.int32:
        mask_bs = mask_bs.astype(jnp.int32)
    kernel = functools.partial(_kernel, chunk_blocks=chunk_blocks, block_s=block_s, blocks=blocks,
                               scale=float(scale))
    o, m, l = pl.pallas_call(
        kernel,
        grid=(b, k_heads, chunks),
        in_specs=[
            pl.BlockSpec((), lambda i, j, c: ()),
            pl.BlockSpec((None, None, rows, h), lambda i, j, c: (i, j, 0, 0)),
            pl.BlockSpec((b, slots), lambda i, j, c: (0, 0)),
            pl.BlockSpec((num_layers, b, slots, k_heads, h), lambda i, j, c: (0, 0, 0, 0, 0)),
            pl.BlockSpec((num_layers, b, slots, k_heads, h), lambda i, j, c: (0, 0, 0, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, rows, h), lambda i, j, c: (i, j, c, 0, 0)),
            pl.BlockSpec((None, None, None, rows), lambda i, j, c: (i, j, c, 0)),
            pl.BlockSpec((None, None, None, rows), lambda i, j, c: (i, j, c, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((b, k_heads, chunks, rows, h), jnp.float32),
            jax.ShapeDtypeStruct((b, k_heads, chunks, rows), jnp.float32),
            jax.ShapeDtypeStruct((b, k_heads, chunks, rows), jnp.float32),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="stacked_cache_decode_attention",
    )(layer, q, mask_bs, k_cache, v_cache)
    return _combine_kernel(o, m, l, g, out_dtype, interpret)[:, :, :g]


def _combine(o_ref, m_ref, l_ref, out_ref):
    rows = out_ref.shape[0]
    o = o_ref[:, pl.ds(0, rows), :]  # [C, rows, H]: only the real query rows (rounded up to a power of two)
    m = m_ref[:, pl.ds(0, rows)]
    l = l_ref[:, pl.ds(0, rows)]
    w = jnp.exp(m - jnp.max(m, axis=0)[None, :])  # a chunk with nothing unmasked has m = _NEG: weight 0
    total = jnp.sum(w * l, axis=0)
    out = jnp.sum(w[:, :, None] * o, axis=0) / jnp.where(total > 0, total, 1.0)[:, None]
    out_ref[...] = out.astype(out_ref.dtype)


def _combine_kernel(o, m, l, g: int, out_dtype, interpret: bool):
    """The chunks' partial outputs combined (each rescaled by exp(its max - the overall max)), one program per
    (row, kv head). One kernel where XLA needed three (exp, weighted sum, normalise + convert: 10 us per layer
    at batch 1, 0.4 ms per Qwen3-8B token)."""
    b, k_heads, chunks, rows, h = o.shape
    out_rows = 1 << (g - 1).bit_length()
    return pl.pallas_call(
        _combine,
        grid=(b, k_heads),
        in_specs=[pl.BlockSpec((None, None, chunks, rows, h), lambda i, j: (i, j, 0, 0, 0)),
                  pl.BlockSpec((None, None, chunks, rows), lambda i, j: (i, j, 0, 0)),
                  pl.BlockSpec((None, None, chunks, rows), lambda i, j: (i, j, 0, 0))],
        out_specs=pl.BlockSpec((None, None, out_rows, h), lambda i, j: (i, j, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((b, k_heads, out_rows, h), out_dtype),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="decode_attention_combine",
    )(o, m, l)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def decode_block(slots: int) -> int | None:
    """Cache slots per loop step: 64 where S allows (bigger tiles stream better), else 32 or 16; None when S
    is no multiple of 16 (the cache is walked in whole blocks, so no load ever runs past its end)."""
    return next((b for b in (64, 32, 16) if slots % b == 0), None)


def decode_attention_supported(head_dim: int, slots: int, block_s: int | None = None) -> bool:
    """Whether the kernel handles these shapes (Triton tiles are powers of two, of at least 16)."""
    block_s = block_s or decode_block(slots)
    return (_power_of_two(head_dim) and 16 <= head_dim <= 256 and block_s is not None
            and _power_of_two(block_s) and block_s >= 16 and slots % block_s == 0)
