"""Attention kernels on the lent GPUs: speed (TFLOP/s), correctness, ring attention over several GPUs.

    python scripts/bench_attention.py                       # 8K/32K/128K, every available impl + torch SDPA
    python scripts/bench_attention.py --lengths 32768 --impls pallas,pallas-mosaic,cudnn
    python scripts/bench_attention.py --ring                # >= 2 GPUs: ring vs single-GPU kernel, max length
    python scripts/bench_attention.py --smoke --no-record   # CPU, tiny sizes (tests the script itself)
    python scripts/bench_attention.py --lengths 32768 --impls cudnn,xla --window 1024   # Gemma 3's local layers

Impls: ``pallas`` is the hybrid on Hopper+ (tokamax Mosaic forward + cuDNN flash backward fed its LSE;
tokamax's own backward with segment ids), ``pallas-mosaic`` / ``pallas-triton`` tokamax alone, ``cudnn``,
``xla`` (blockwise reference), ``torch`` (SDPA, the peer). A note gives each impl's fwd+bwd as % of cuDNN.

Shapes default to Qwen3-8B attention: bf16, causal, 32 query heads, 8 kv heads, head_dim 128, batch 1.
FLOPs count the causal half only (docs/flops.md): fwd = 2 B S^2 H D, fwd+bwd = 3.5 x fwd; with ``--window W``
(only the impls that honour one: ``ops.contract.WINDOW_IMPLS``) the visible pairs, S^2 -> 2 S W - W^2.
Correctness: every impl's output and dq/dk/dv on random bf16 inputs against the fp32 blockwise reference
(``impl="xla"`` on fp32 copies, HIGHEST matmul precision), relative max error, at lengths <= --check-max-len;
the pallas path is also checked with packed rows (segment ids). Timing: warm-up, then the median of
--iters runs, each ended by block_until_ready (torch: cuda synchronize). torch's scaled_dot_product_attention
runs first, in the same process, as the peer (JAX is told not to preallocate GPU memory).

tokamax (the ``pallas`` GPU kernels) imports ``xprof`` only for its own benchmarking helpers; on machines
without xprof this script registers empty stand-in modules first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:  # before jax is imported: CPU with 2 fake devices so --ring runs too
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    from longrm_jax.cli_support import fake_cpu_device_threads  # imports no jax

    fake_cpu_device_threads()  # a pool the fake devices' collectives cannot exhaust
# torch shares the GPU: let JAX grow its pool instead of grabbing 75% up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def stub_xprof_if_missing():
    """tokamax imports xprof at import time; register empty modules when it is not installed."""
    try:
        import xprof  # noqa: F401
    except ImportError:
        from longrm_jax.ops.flash import register_xprof_stub

        register_xprof_stub()


stub_xprof_if_missing()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import _bench  # noqa: E402  (scripts/_bench.py: Python puts the script's folder on sys.path)
from _bench import median_seconds  # noqa: E402
from longrm_jax.ops import attention, dispatch, flash  # noqa: E402
from longrm_jax.ops.contract import WINDOW_IMPLS  # noqa: E402
from longrm_jax.ops.ring import ring_attention  # noqa: E402
from longrm_jax.ops.xla_attention import xla_attention_with_lse  # noqa: E402
from longrm_jax.parallel.mesh import make_mesh  # noqa: E402
from longrm_jax.parallel.zigzag import zigzag_reorder, zigzag_restore  # noqa: E402

ALL_IMPLS = ("torch", "cudnn", "pallas", "pallas-mosaic", "pallas-triton", "xla")
TAKES_SEGMENTS = ("pallas", "pallas-mosaic", "pallas-triton", "xla")


def fwd_flops(b, s, h, d, window=None):
    squares = s * s if window is None or window >= s else 2 * s * window - window * window
    return 2.0 * b * squares * h * d  # causal: half of 4 B S^2 H D (a window: its visible pairs, docs/flops.md)


def tflops(flops, seconds):
    return flops / seconds / 1e12 if seconds and seconds > 0 else float("nan")


def rel_err(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def random_inputs(b, t, hq, hkv, d, dtype, seed=0):
    kq, kk, kv, kd = jax.random.split(jax.random.key(seed), 4)
    return (jax.random.normal(kq, (b, t, hq, d), dtype), jax.random.normal(kk, (b, t, hkv, d), dtype),
            jax.random.normal(kv, (b, t, hkv, d), dtype), jax.random.normal(kd, (b, t, hq, d), dtype))


def sharded_random_inputs(b, t, hq, hkv, d, dtype, sharding, seed=0):
    """Like random_inputs, but generated directly in their sharded layout (no full copy on one device)."""
    return jax.jit(lambda: random_inputs(b, t, hq, hkv, d, dtype, seed), out_shardings=(sharding,) * 4)()


def packed_segments(b, t, n_segments=4):
    """Rows of n_segments samples of uneven lengths plus padding (0) at the end."""
    cuts = np.linspace(0, t * 15 // 16, n_segments + 1).astype(int)
    cuts[1:-1] += t // (8 * n_segments)
    row = np.zeros(t, np.int32)
    for i in range(n_segments):
        row[cuts[i]:cuts[i + 1]] = i + 1
    return jnp.asarray(np.tile(row, (b, 1)))


# --------------------------------------------------------------------------------------- implementations


def jax_impl(name, window=None):
    """attention(q, k, v, segment_ids) for a bench impl name, or raise if it is unavailable here."""
    if name != "xla":
        kernel = flash.get_kernel(name)  # raises AttentionNotSupportedError when unavailable
        _ = getattr(kernel, "op", None)  # tokamax: fails here if this platform has no such kernel
    return lambda q, k, v, seg=None: attention(q, k, v, segment_ids=seg, impl=name, window=window)


def fwd_and_grad_fns(attn):
    fwd = jax.jit(lambda q, k, v: attn(q, k, v))

    @jax.jit
    def fwd_bwd(q, k, v, dout):
        out, vjp = jax.vjp(lambda q, k, v: attn(q, k, v), q, k, v)
        return out, vjp(dout)

    return fwd, fwd_bwd


def reference(q, k, v, dout, seg=None, window=None):
    """fp32 blockwise reference on fp32 copies: (out, (dq, dk, dv))."""
    up = [x.astype(jnp.float32) for x in (q, k, v, dout)]

    @jax.jit
    def run(q, k, v, dout, seg):
        f = lambda q, k, v: xla_attention_with_lse(q, k, v, q_segment_ids=seg, kv_segment_ids=seg,  # noqa: E731
                                                   window=window)[0]
        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(dout)

    return run(*up, seg)


def check(name, got, want, tol):
    (out, grads), (want_out, want_grads) = got, want
    errs = [rel_err(out, want_out)] + [rel_err(g, w) for g, w in zip(grads, want_grads)]
    ok = all(e < tol for e in errs)
    return ok, "out {:.1e} dq {:.1e} dk {:.1e} dv {:.1e}".format(*errs) + ("" if ok else f"  FAIL (>{tol})")


# ------------------------------------------------------------------------------------------------ torch


def torch_peer(b, t, hq, hkv, d, iters, warmup, smoke):
    """torch SDPA (bf16, causal, GQA) fwd and fwd+bwd seconds, or None when torch/GPU is unavailable."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not smoke:
        return None
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, hq, t, d, device=device, dtype=dtype, generator=g, requires_grad=True)
    k = torch.randn(b, hkv, t, d, device=device, dtype=dtype, generator=g, requires_grad=True)
    v = torch.randn(b, hkv, t, d, device=device, dtype=dtype, generator=g, requires_grad=True)
    dout = torch.randn(b, hq, t, d, device=device, dtype=dtype, generator=g)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(dout)

    def timed(fn):
        return median_seconds(fn, iters=iters, warmup=warmup, sync=lambda _: sync())

    try:
        result = timed(fwd), timed(fwd_bwd)
    finally:
        del q, k, v, dout
        if device == "cuda":
            torch.cuda.empty_cache()
    return result


# ------------------------------------------------------------------------------------------ single GPU


def bench_single(args, rows, notes):
    b, hq, hkv, d = args.batch, args.heads, args.kv_heads, args.head_dim
    impls = [i for i in args.impls.split(",") if i]
    if args.window:
        skipped = [i for i in impls if i not in WINDOW_IMPLS]
        impls = [i for i in impls if i in WINDOW_IMPLS]
        if skipped:
            notes.append(f"--window {args.window}: {', '.join(skipped)} skipped (they do not honour a window)")
    for t in args.lengths:
        flops = fwd_flops(b, t, hq, d, args.window)
        if "torch" in impls:
            try:
                res = torch_peer(b, t, hq, hkv, d, args.iters, args.warmup, args.smoke)
            except Exception as e:  # noqa: BLE001 - report and go on (e.g. OOM)
                res = None
                notes.append(f"FAIL torch at {t}: {type(e).__name__}: {str(e)[:200]}")
            if res:
                rows.append(dict(impl="torch sdpa", length=t, fwd=tflops(flops, res[0]),
                                 fwd_bwd=tflops(3.5 * flops, res[1]), check="(peer)"))
                print_row(rows[-1])
        dtype = jnp.float32 if args.smoke else jnp.bfloat16
        q, k, v, dout = random_inputs(b, t, hq, hkv, d, dtype)
        want = want_seg = None
        if t <= args.check_max_len:
            want = reference(q, k, v, dout, window=args.window)
        for name in impls:
            if name == "torch":
                continue
            if name == "xla" and t > args.xla_max_len:
                continue
            try:
                attn = jax_impl(name, args.window)
            except Exception as e:  # noqa: BLE001
                notes.append(f"{name}: unavailable ({str(e)[:160]})")
                continue
            try:
                tuned = autotuned(args, name, attn, (q, k, v, dout), notes)
                with tuned:  # tokamax picks configs when the functions are traced: build them inside
                    fwd, fwd_bwd = fwd_and_grad_fns(attn)
                    t_fwd = median_seconds(fwd, q, k, v, iters=args.iters, warmup=args.warmup)
                    t_fb = median_seconds(fwd_bwd, q, k, v, dout, iters=args.iters, warmup=args.warmup)
                status = "-"
                if want is not None:
                    status = check(name, fwd_bwd(q, k, v, dout), want, args.tol)[1]
                    if name in TAKES_SEGMENTS and not args.window:
                        seg = packed_segments(b, t)
                        if want_seg is None:
                            want_seg = reference(q, k, v, dout, seg)
                        seg_fb = jax.jit(lambda q, k, v, do, s: jax.vjp(lambda q, k, v: attn(q, k, v, s),
                                                                        q, k, v)[1](do))
                        got = (jax.jit(lambda q, k, v, s: attn(q, k, v, s))(q, k, v, seg), seg_fb(q, k, v, dout, seg))
                        status += "; packed: " + check(name, got, want_seg, args.tol)[1]  # no '|': table cell
                rows.append(dict(impl=name, length=t, fwd=tflops(flops, t_fwd),
                                 fwd_bwd=tflops(3.5 * flops, t_fb), check=status))
                print_row(rows[-1])
                if args.packed and name in TAKES_SEGMENTS and not args.window:
                    # Packed rows (4 samples + padding): the same dense causal FLOP count over the time,
                    # i.e. "effective" throughput; the real work is smaller (block-diagonal mask).
                    seg = packed_segments(b, t)
                    with tuned:
                        pf, pfb = fwd_and_grad_fns(lambda q, k, v: attn(q, k, v, seg))
                        p_fwd = median_seconds(pf, q, k, v, iters=args.iters, warmup=args.warmup)
                        p_fb = median_seconds(pfb, q, k, v, dout, iters=args.iters, warmup=args.warmup)
                    rows.append(dict(impl=name + " packed", length=t, fwd=tflops(flops, p_fwd),
                                     fwd_bwd=tflops(3.5 * flops, p_fb), check="4 segments; effective TFLOP/s"))
                    print_row(rows[-1])
            except Exception as e:  # noqa: BLE001 - e.g. out of memory at 128K: record, go on, exit non-zero
                notes.append(f"FAIL {name} at {t}: {type(e).__name__}: {str(e)[:200]}")
                print("  " + notes[-1], flush=True)
        if want is not None and not args.window:
            lse_agreement(q, k, v, notes)
        vs_cudnn(rows, t, notes)
        del q, k, v, dout, want, want_seg


def lse_agreement(q, k, v, notes):
    """The hybrid feeds tokamax's LSE to cuDNN's backward: both forwards' statistics must agree."""
    from longrm_jax.ops import cudnn_flash

    if not (flash.hybrid_available() and cudnn_flash.supports(q, k, causal=True, has_segment_ids=False)):
        return
    try:
        lse_pallas = jax.jit(lambda q, k, v: flash.get_kernel("pallas").fwd(q, k, v)[1])(q, k, v)
        lse_cudnn = jax.jit(lambda q, k, v: cudnn_flash.flash_forward(q, k, v)[1])(q, k, v)
        diff = float(jnp.max(jnp.abs(lse_pallas - lse_cudnn)))
        notes.append(f"T={q.shape[1]}: max |LSE tokamax - LSE cuDNN| = {diff:.2e}"
                     + ("" if diff < 0.05 else "  FAIL (statistics disagree)"))
    except Exception as e:  # noqa: BLE001
        notes.append(f"FAIL T={q.shape[1]}: LSE comparison crashed: {type(e).__name__}: {str(e)[:160]}")
    print("  " + notes[-1], flush=True)


def vs_cudnn(rows, t, notes):
    """Each impl's fwd and fwd+bwd throughput as a percentage of cuDNN's in this run (acceptance: pallas >= 95%)."""
    base = next((r for r in rows if r["impl"] == "cudnn" and r["length"] == t), None)
    if base is None:
        return
    parts = [f"{r['impl']} {100 * r['fwd'] / base['fwd']:.0f}% / {100 * r['fwd_bwd'] / base['fwd_bwd']:.0f}%"
             for r in rows if r["length"] == t and r["impl"] not in ("cudnn",) and "packed" not in r["impl"]]
    if parts:
        notes.append(f"T={t}: fwd / fwd+bwd as % of cudnn: " + ", ".join(parts))
        print("  " + notes[-1], flush=True)


def kernel_names():
    """What each accelerator impl name runs on this machine (e.g. whether ``pallas`` is the hybrid)."""
    from longrm_jax.ops import cudnn_flash

    names = []
    for impl in ("pallas", "pallas-mosaic", "cudnn"):
        try:
            names.append(f"{impl} = {flash.get_kernel(impl).name}")
        except Exception as e:  # noqa: BLE001
            names.append(f"{impl} unavailable ({type(e).__name__})")
    api = "yes" if cudnn_flash.available() else f"NO ({cudnn_flash.UNAVAILABLE_REASON})"
    return "kernels: " + "; ".join(names) + f"; private cuDNN API: {api}"


def fmt(x):
    return f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def autotuned(args, name, attn, example, notes):
    """tokamax autotuning results for this impl's ops at these shapes (a context manager), or a no-op."""
    if not (args.autotune and name.startswith("pallas")):
        return contextlib.nullcontext()
    try:
        _, fwd_bwd = fwd_and_grad_fns(attn)
        return flash._tokamax().autotune(fwd_bwd, *example, progress_bar=False)
    except Exception as e:  # noqa: BLE001 - autotuning is optional: fall back to tokamax's heuristics
        notes.append(f"{name}: autotuning failed ({type(e).__name__}: {str(e)[:160]}); heuristic configs used")
        return contextlib.nullcontext()


def print_row(row):
    print(f"  {row['impl']:<14} T={row['length']:>7}  fwd {fmt(row['fwd']):>7}  fwd+bwd {fmt(row['fwd_bwd']):>7} "
          f"TFLOP/s  {row['check']}", flush=True)


# ------------------------------------------------------------------------------------------------ ring


def ring_fns(mesh, impl, segment_ids=None, causal=True):
    def attn(q, k, v):
        return ring_attention(q, k, v, mesh=mesh, segment_ids=segment_ids, impl=impl, causal=causal)

    return fwd_and_grad_fns(attn)


def bench_ring(args, rows, notes):
    n = len(jax.devices())
    if n < 2:
        notes.append("--ring needs >= 2 devices")
        return
    mesh = make_mesh(data=1, fsdp=1, seq=n, tensor=1)
    b, hq, hkv, d = args.batch, args.heads, args.kv_heads, args.head_dim
    dtype = jnp.float32 if args.smoke else jnp.bfloat16
    shard = NamedSharding(mesh, P(None, "seq", None, None))
    impl = args.ring_impl

    # Correctness: ring (zigzag, causal) vs the fp32 reference on one device, with and without packed rows.
    t = n * args.ring_check_len
    q, k, v, dout = random_inputs(b, t, hq, hkv, d, dtype, seed=1)
    for seg in (None, packed_segments(b, t)):
        want = reference(q, k, v, dout, seg)
        zz = [jax.device_put(zigzag_reorder(x, n), shard) for x in (q, k, v, dout)]
        seg_zz = None if seg is None else zigzag_reorder(seg, n)
        with jax.set_mesh(mesh):
            _, fwd_bwd = ring_fns(mesh, impl, seg_zz)
            out, grads = fwd_bwd(*zz)
        got = (zigzag_restore(out, n), tuple(zigzag_restore(g, n) for g in grads))
        ok, msg = check("ring", got, want, args.tol)
        label = "packed" if seg is not None else "plain"
        notes.append(f"ring[{impl}] x{n} correctness at T={t} ({label}): {msg}")
        print("  " + notes[-1], flush=True)

    # Throughput: per-GPU length L, global n x L, against the single-device kernel at L.
    single_impl = dispatch.local_impl(impl)
    for per_gpu in args.lengths:
        t = n * per_gpu
        try:
            qs, ks, vs, dos = random_inputs(b, per_gpu, hq, hkv, d, dtype)
            fwd1, fb1 = fwd_and_grad_fns(jax_impl(single_impl))
            s_fwd = median_seconds(fwd1, qs, ks, vs, iters=args.iters, warmup=args.warmup)
            s_fb = median_seconds(fb1, qs, ks, vs, dos, iters=args.iters, warmup=args.warmup)
            del qs, ks, vs, dos
            q, k, v, dout = sharded_random_inputs(b, t, hq, hkv, d, dtype, shard)
            with jax.set_mesh(mesh):
                fwd, fwd_bwd = ring_fns(mesh, impl)
                r_fwd = median_seconds(fwd, q, k, v, iters=args.iters, warmup=args.warmup)
                r_fb = median_seconds(fwd_bwd, q, k, v, dout, iters=args.iters, warmup=args.warmup)
                if per_gpu == args.lengths[0]:
                    # Causal block skipping must save the hidden half: compare with the unmasked ring.
                    nc_fwd, nc_fb = ring_fns(mesh, impl, causal=False)
                    ratio = (r_fwd / median_seconds(nc_fwd, q, k, v, iters=args.iters, warmup=args.warmup),
                             r_fb / median_seconds(nc_fb, q, k, v, dout, iters=args.iters, warmup=args.warmup))
                    notes.append(f"ring x{n} at T={t}: causal / non-causal time = {ratio[0]:.2f} fwd, "
                                 f"{ratio[1]:.2f} fwd+bwd (0.5 = the masked half costs nothing)")
                    print("  " + notes[-1], flush=True)
            del q, k, v, dout
        except Exception as e:  # noqa: BLE001
            notes.append(f"FAIL ring at {per_gpu}/GPU: {type(e).__name__}: {str(e)[:200]}")
            continue
        single = (tflops(fwd_flops(b, per_gpu, hq, d), s_fwd), tflops(3.5 * fwd_flops(b, per_gpu, hq, d), s_fb))
        ring = (tflops(fwd_flops(b, t, hq, d) / n, r_fwd), tflops(3.5 * fwd_flops(b, t, hq, d) / n, r_fb))
        rows.append(dict(impl=f"ring[{impl}] x{n}", length=t, fwd=ring[0], fwd_bwd=ring[1],
                         check=f"per GPU; single-GPU {single_impl} at {per_gpu}: {fmt(single[0])} / {fmt(single[1])}"
                               f" -> {100 * ring[0] / single[0]:.0f}% / {100 * ring[1] / single[1]:.0f}%"))
        print_row(rows[-1])

    # Longest Qwen3-8B-shaped attention (fwd+bwd) the ring runs: double until it fails or gets too slow.
    longest = None
    t = n * args.search_start
    while t <= args.search_max:
        try:
            q, k, v, dout = sharded_random_inputs(1, t, hq, hkv, d, dtype, shard)
            with jax.set_mesh(mesh):
                _, fwd_bwd = ring_fns(mesh, impl)
                compiled = fwd_bwd.lower(q, k, v, dout).compile()
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(q, k, v, dout))  # one timed run: these are long
                secs = time.perf_counter() - t0
            del q, k, v, dout, compiled
        except Exception as e:  # noqa: BLE001 - typically RESOURCE_EXHAUSTED
            notes.append(f"search: T={t} failed: {type(e).__name__}: {str(e)[:160]}")
            print("  " + notes[-1], flush=True)
            break
        longest = (t, secs)
        print(f"  search: T={t} fwd+bwd {secs:.2f} s "
              f"({tflops(3.5 * fwd_flops(1, t, hq, d) / n, secs):.0f} TFLOP/s per GPU)", flush=True)
        if secs * 4 > args.search_seconds:
            notes.append(f"search stopped at T={t}: the next length would take ~{4 * secs:.0f} s")
            break
        t *= 2
    if longest:
        notes.append(f"longest Qwen3-8B-shaped attention fwd+bwd on {n} devices: T={longest[0]} "
                     f"({longest[0] // 1024}K tokens) in {longest[1]:.2f} s")


# ----------------------------------------------------------------------------------------------- main


def record(path, args, rows, notes):
    details = (f"jax {jax.__version__}, tokamax {'yes' if flash.tokamax_available() else 'no'}; batch {args.batch}, "
               f"{args.heads} q heads, {args.kv_heads} kv heads, head_dim {args.head_dim}, causal, TFLOP/s with causal "
               "FLOPs halved" + (f"; sliding window {args.window} (FLOPs of its visible pairs)." if args.window
                                 else "."))
    table = _bench.markdown_table(("impl", "T", "fwd TFLOP/s", "fwd+bwd TFLOP/s", "check (rel. error vs fp32)"),
                                  [(r["impl"], r["length"], fmt(r["fwd"]), fmt(r["fwd_bwd"]), r["check"]) for r in rows],
                                  align="lrrrl")
    _bench.append_section(path, "attention kernels", command=_bench.command_line(), device=_bench.devices_name(),
                          details=details, table=table, notes=notes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192,32768,131072",
                        help="sequence lengths (with --ring: per-GPU lengths), comma separated")
    parser.add_argument("--impls", default=",".join(ALL_IMPLS), help=f"subset of {','.join(ALL_IMPLS)}")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--tol", type=float, default=2e-2, help="relative error tolerance of the checks")
    parser.add_argument("--check-max-len", type=int, default=32768, help="check correctness up to this length")
    parser.add_argument("--xla-max-len", type=int, default=32768, help="skip the slow xla impl above this")
    parser.add_argument("--window", type=int, default=None,
                        help="causal sliding window W (Gemma 3's local layers): only impls that honour one run")
    parser.add_argument("--packed", action="store_true",
                        help="also time the impls that take segment ids on packed rows (4 samples per row)")
    parser.add_argument("--autotune", action="store_true",
                        help="autotune tokamax's kernel configs at each shape before timing the pallas impls")
    parser.add_argument("--ring", action="store_true", help="ring attention over all devices (>= 2)")
    parser.add_argument("--ring-impl", default="auto",
                        help="block kernel of the ring (auto/pallas/pallas-mosaic/cudnn/xla)")
    parser.add_argument("--ring-check-len", type=int, default=4096, help="per-device length of the ring check")
    parser.add_argument("--search-start", type=int, default=131072, help="per-device start of the length search")
    parser.add_argument("--search-max", type=int, default=1 << 23, help="largest global length to try")
    parser.add_argument("--search-seconds", type=float, default=120.0,
                        help="stop doubling when the next length would take longer than this")
    _bench.add_common_flags(parser, smoke_help="CPU, tiny shapes: checks that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.lengths, args.heads, args.kv_heads, args.head_dim = "128,256", 4, 2, 32
        args.iters, args.warmup, args.check_max_len = 2, 1, 256
        args.ring_check_len, args.search_start, args.search_max, args.tol = 64, 128, 512, 1e-4
        args.ring_impl = "xla"
    args.lengths = [int(x) for x in str(args.lengths).split(",") if x]
    print(f"{_bench.devices_name()}; tokamax: "
          f"{flash.tokamax_available()}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    rows, notes = [], [kernel_names()]
    print("  " + notes[0], flush=True)
    if args.ring:
        bench_ring(args, rows, notes)
    else:
        bench_single(args, rows, notes)
    print()
    print(f"{'impl':<24} {'T':>8} {'fwd':>8} {'fwd+bwd':>8}  check")
    for r in rows:
        print(f"{r['impl']:<24} {r['length']:>8} {fmt(r['fwd']):>8} {fmt(r['fwd_bwd']):>8}  {r['check']}")
    for n in notes:
        print("-", n)
    path = _bench.record_path(args)
    if path:
        record(path, args, rows, notes)
    failed = [n for n in notes if "FAIL" in n] + [r for r in rows if "FAIL" in r["check"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
