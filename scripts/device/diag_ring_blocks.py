"""Diagnostic (issue 40, ring straggler): time the ring's off-diagonal block kernels at their two zigzag shapes.

A zigzag ring device r only ever runs "earlier" hops (all local queries x the first key half: q 2c x kv c) when
r = n-1, and only "later" hops (the second query half x all keys: q c x kv 2c) when r = 0. Same FLOPs, different
shapes. This times each shape's forward and backward (the ring's block kernel, ``ops.dispatch.block_kernel``)
on every visible GPU, so a slower shape or a slower GPU shows up. Not a product figure: a diagnosis.
  python scripts/device/diag_ring_blocks.py --chunk 16384 --rows 2
"""
import argparse
import time

import jax
import jax.numpy as jnp

from longrm_jax.ops.dispatch import block_kernel


def timed(fn, *args, reps):
    out = fn(*args)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=16384, help="half-block length c (tokens)")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--impl", default="pallas")
    ap.add_argument("--no-segments", action="store_true", help="no segment ids (as one sequence per row trains: "
                    "the hybrid kernel's backward is then cuDNN's, with them tokamax's Mosaic VJP)")
    a = ap.parse_args()
    kernel = block_kernel(a.impl, has_segment_ids=not a.no_segments, dtype=jnp.bfloat16)
    scale = 128 ** -0.5
    c, b = a.chunk, a.rows
    shapes = {"earlier (q 2c x kv c)": (2 * c, c), "later (q c x kv 2c)": (c, 2 * c), "square (q c x kv c)": (c, c)}
    print(f"kernel {type(kernel).__name__}, segment ids {not a.no_segments}, rows {b}, heads {a.heads}/{a.kv_heads}, c={c}")
    print("| GPU | shape | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s |")
    print("|---|---|---:|---:|---:|---:|")
    for dev in jax.devices():
        for name, (tq, tk) in shapes.items():
            key = jax.random.key(0)
            ks = jax.random.split(key, 4)
            with jax.default_device(dev):
                q = jax.random.normal(ks[0], (b, tq, a.heads, 128), jnp.bfloat16)
                k = jax.random.normal(ks[1], (b, tk, a.kv_heads, 128), jnp.bfloat16)
                v = jax.random.normal(ks[2], (b, tk, a.kv_heads, 128), jnp.bfloat16)
                do = jax.random.normal(ks[3], (b, tq, a.heads, 128), jnp.bfloat16)
                qs = None if a.no_segments else jnp.ones((b, tq), jnp.int32)
                kvs = None if a.no_segments else jnp.ones((b, tk), jnp.int32)
                fwd = jax.jit(lambda q, k, v, qs, kvs: kernel.fwd(q, k, v, q_segment_ids=qs, kv_segment_ids=kvs,
                                                                  causal=False, scale=scale))
                out, lse = fwd(q, k, v, qs, kvs)
                bwd = jax.jit(lambda q, k, v, o, l, do, qs, kvs: kernel.bwd(
                    q, k, v, o, l, do, q_segment_ids=qs, kv_segment_ids=kvs, causal=False, scale=scale))
                tf = timed(fwd, q, k, v, qs, kvs, reps=a.reps)
                tb = timed(bwd, q, k, v, out, lse, do, qs, kvs, reps=a.reps)
            flops = 4 * b * a.heads * tq * tk * 128
            print(f"| {dev.id} | {name} | {tf * 1e3:.2f} | {tb * 1e3:.2f} | {flops / tf / 1e12:.0f} | "
                  f"{2.5 * flops / tb / 1e12:.0f} |", flush=True)


if __name__ == "__main__":
    main()
