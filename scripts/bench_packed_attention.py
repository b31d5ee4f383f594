"""Packed rows (segment ids) vs the same sequences as rows: attention fwd+bwd speed and correctness on a GPU.

    python scripts/bench_packed_attention.py               # H200: probe, checks, the timed cases below
    python scripts/bench_packed_attention.py --smoke       # CPU, tiny shapes (the script itself; no cuDNN)

Cases (Qwen3-8B attention: bf16, causal, 32 q heads, 8 kv heads, head_dim 128):
  pair:    one 64K row holding a 2 x 32K pair (segment ids 1, 2)  vs  2 rows of 32K (no segment ids)
  groups:  one 128,000-token row of 8 x 16,000 sequences          vs  8 rows of 16,000
  uneven:  one 128,000-token row of 8 uneven sequences + padding (packed only)
TFLOP/s count only the causal FLOPs within each sequence (fwd = 2 L^2 H D per sequence, fwd+bwd = 3.5 x).
Impls: ``pallas`` (tokamax Mosaic forward; backward cuDNN's, ragged for packed rows: ops.cudnn_packed) and
``pallas-mosaic`` (tokamax alone: the packed path before ops.cudnn_packed).

Before timing: the probe runs cuDNN's own packed forward and checks (1) its output against the fp32
reference and (2) its ragged statistics against ``cudnn_packed.packed_stats`` of the reference LSE: the
layout the backward is fed. Then out and dq/dk/dv of ``pallas`` on packed rows (2 rows with different run
counts, padding included) against the fp32 reference, zero gradients at padding where dout is zero there,
and the overflow fallback (more runs than the bound -> tokamax's backward).
"""

from __future__ import annotations

import argparse
import sys

# Both live next to this script (Python puts its folder on sys.path); bench_attention sets up JAX and the xprof
# stand-in before anything imports jax.
import bench_attention as ba  # noqa: E402
import _bench  # noqa: E402
from _bench import median_seconds  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from longrm_jax.ops import cudnn_flash, cudnn_packed  # noqa: E402
from longrm_jax.ops.xla_attention import xla_attention_with_lse  # noqa: E402


def segments_row(lengths, total):
    row = np.zeros(total, np.int32)
    start = 0
    for i, n in enumerate(lengths):
        row[start:start + n] = i + 1
        start += n
    assert start <= total
    return row


def seg_flops(lengths, h, d):
    return sum(2.0 * n * n * h * d for n in lengths)


def ref_with_lse(q, k, v, dout, seg):
    up = [x.astype(jnp.float32) for x in (q, k, v, dout)]

    @jax.jit
    def run(q, k, v, dout, seg):
        f = lambda q, k, v: xla_attention_with_lse(q, k, v, q_segment_ids=seg, kv_segment_ids=seg)  # noqa: E731
        (out, lse), vjp = jax.vjp(f, q, k, v)
        return out, lse, vjp((dout, jnp.zeros_like(lse)))

    return run(*up, seg)


def probe(args, notes):
    """cuDNN's packed forward vs the reference; its ragged statistics vs packed_stats (the backward's input)."""
    h, kvh, d = args.heads, args.kv_heads, args.head_dim
    t = args.check_len
    seg = jnp.asarray(np.stack([segments_row([t // 4, t // 2, t // 8], t), segments_row([t // 3, t // 2], t)]))
    q, k, v, dout = ba.random_inputs(2, t, h, kvh, d, jnp.bfloat16, seed=5)
    out_ref, lse_ref, _ = ref_with_lse(q, k, v, dout, seg)
    m = 6
    info = cudnn_packed.segment_runs(seg, m)
    out, stats = jax.jit(lambda q, k, v: cudnn_packed.forward_packed(q, k, v, info))(q, k, v)
    notes.append(f"probe: cuDNN packed forward out vs fp32: {ba.rel_err(out, out_ref):.1e}; runs "
                 f"{int(info['runs'])}; stats shape {tuple(stats.shape)}")
    want = cudnn_packed.packed_stats(lse_ref, info)
    slabs = int(info["runs"])
    lens = [x for x in np.asarray(info["lengths"]).ravel().tolist() if x >= 0]
    valid = np.zeros(stats.shape, bool)
    for s, n in enumerate(lens):
        valid[s, :, :n] = True
    diff = float(np.max(np.abs(np.where(valid, np.asarray(stats) - np.asarray(want), 0.0))))
    ok = diff < 0.05
    notes.append(f"probe: ragged statistics vs packed_stats(reference LSE) over {slabs} sequences: max |diff| "
                 f"{diff:.2e}" + ("" if ok else "  FAIL (layout differs)"))
    if not ok:  # describe what cuDNN wrote, to work the layout out from the log
        st = np.asarray(stats)
        lr = np.asarray(lse_ref)
        for s in range(min(stats.shape[0], 6)):
            notes.append(f"  slab {s}: head0 first 4 {np.round(st[s, 0, :4], 3).tolist()} "
                         f"nonzero {int(np.count_nonzero(st[s]))}")
        notes.append(f"  reference LSE row0 head0 at 0,{t // 4},{3 * t // 4}: "
                     f"{np.round(lr[0, 0, [0, t // 4, 3 * t // 4]], 3).tolist()}; row1 at 0,{t // 3}: "
                     f"{np.round(lr[1, 0, [0, t // 3]], 3).tolist()}")
    back = cudnn_packed.unpack_stats(stats, info)
    notes.append(f"probe: unpack_stats(cuDNN stats) vs reference LSE: "
                 f"{float(jnp.max(jnp.abs(back - lse_ref))):.2e}")
    return ok


def checks(args, notes):
    h, kvh, d = args.heads, args.kv_heads, args.head_dim
    t = args.check_len
    seg = jnp.asarray(np.stack([segments_row([t // 4, t // 2, t // 8], t), segments_row([t // 3, t // 2], t)]))
    q, k, v, dout = ba.random_inputs(2, t, h, kvh, d, jnp.float32 if args.smoke else jnp.bfloat16, seed=7)
    dout = jnp.where((seg > 0)[..., None, None], dout, 0)  # padding carries no loss, as in training
    out_ref, _, grads_ref = ref_with_lse(q, k, v, dout, seg)
    attn = ba.jax_impl(args.impl)
    ok_all = True
    # Default bound: the whole-row view; 2: half-row views whose runs cross view rows; 1: no view, fallback.
    for bound, label in ((None, f"bound {cudnn_packed.DEFAULT_MAX_RUNS}"), (2, "bound 2: half-row view, runs "
                         "crossing view rows"), (1, "bound 1: fallback")):
        def f(q, k, v, do, s, bound=bound):
            ctx = cudnn_packed.max_segments_per_row(bound) if bound else jax.named_scope("packed")
            with ctx:
                out, vjp = jax.vjp(lambda q, k, v: attn(q, k, v, s), q, k, v)
                return out, vjp(do)

        out, grads = jax.jit(f)(q, k, v, dout, seg)
        ok, msg = ba.check(args.impl, (out, grads), (out_ref, grads_ref), args.tol)
        pad = seg == 0
        pad_max = max(float(jnp.max(jnp.abs(jnp.where(pad[..., None, None], g, 0)))) for g in grads)
        ok = ok and pad_max == 0.0
        notes.append(f"check {args.impl} packed rows ({label}) T={t} x 2 rows: {msg}; max |grad| at padding "
                     f"{pad_max:.1e}" + ("" if pad_max == 0.0 else "  FAIL (padding gradient)"))
        print("  " + notes[-1], flush=True)
        ok_all &= ok
    lowered = jax.jit(lambda q, k, v, do, s: jax.vjp(lambda q, k, v: attn(q, k, v, s), q, k, v)[1](do)).lower(
        q, k, v, dout, seg).as_text()
    notes.append(f"{args.impl} packed backward lowers to cuDNN's ragged backward: "
                 f"{'__cudnn$fmhaSoftmaxBackward' in lowered and 'max_seg_per_batch' in lowered}")
    return ok_all


def time_case(args, name, impl, seqs, total, rows):
    """fwd+bwd seconds of the packed row and (when seqs are equal) of the same sequences as rows."""
    h, kvh, d = args.heads, args.kv_heads, args.head_dim
    attn = ba.jax_impl(impl)
    flops = seg_flops(seqs, h, d)
    seg = jnp.asarray(segments_row(seqs, total)[None])
    q, k, v, dout = ba.random_inputs(1, total, h, kvh, d, jnp.bfloat16, seed=11)
    # The trainer's setting: the default bound, views chosen on the device (ops.cudnn_packed).
    pf, pfb = ba.fwd_and_grad_fns(lambda q, k, v: attn(q, k, v, seg))
    t_pf = median_seconds(pf, q, k, v, iters=args.iters, warmup=args.warmup)
    t_pfb = median_seconds(pfb, q, k, v, dout, iters=args.iters, warmup=args.warmup)
    row = dict(case=name, impl=impl, packed_fwd=ba.tflops(flops, t_pf), packed_fb=ba.tflops(3.5 * flops, t_pfb),
               packed_ms=1e3 * t_pfb)
    if len(set(seqs)) == 1 and sum(seqs) == total:
        n, L = len(seqs), seqs[0]
        rs = [x.reshape(n, L, *x.shape[2:]) for x in (q, k, v, dout)]
        rf, rfb = ba.fwd_and_grad_fns(lambda q, k, v: attn(q, k, v))
        t_rf = median_seconds(rf, *rs[:3], iters=args.iters, warmup=args.warmup)
        t_rfb = median_seconds(rfb, *rs, iters=args.iters, warmup=args.warmup)
        row.update(rows_fwd=ba.tflops(flops, t_rf), rows_fb=ba.tflops(3.5 * flops, t_rfb), rows_ms=1e3 * t_rfb,
                   ratio=t_rfb / t_pfb)
    rows.append(row)
    print("  " + fmt_row(row), flush=True)
    del q, k, v, dout


def fmt_row(r):
    s = (f"{r['case']:<7} {r['impl']:<14} packed fwd {r['packed_fwd']:6.1f} fwd+bwd {r['packed_fb']:6.1f} TFLOP/s "
         f"({r['packed_ms']:.1f} ms)")
    if "rows_fb" in r:
        s += (f" | rows fwd {r['rows_fwd']:6.1f} fwd+bwd {r['rows_fb']:6.1f} ({r['rows_ms']:.1f} ms) | packed speed = "
              f"{100 * r['ratio']:.1f}% of rows")
    return s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="pallas")
    parser.add_argument("--baseline-impl", default="pallas-mosaic", help="'' to skip")
    parser.add_argument("--cases", default="pair,groups,uneven")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--check-len", type=int, default=8192)
    parser.add_argument("--tol", type=float, default=2e-2)
    parser.add_argument("--bounds", default="", help="extra max-runs bounds to time on 'groups' (cost of slack)")
    _bench.add_common_flags(parser, smoke_help="CPU, tiny shapes, impl xla: the script runs")
    args = parser.parse_args(argv)
    total = 128_000
    cases = {"pair": ([32768, 32768], 65536), "groups": ([16000] * 8, total),
             "uneven": ([9000, 21000, 12000, 18000, 7000, 23000, 14000, 16000], total)}
    if args.smoke:
        args.impl, args.baseline_impl, args.heads, args.kv_heads, args.head_dim = "xla", "", 4, 2, 32
        args.check_len, args.iters, args.warmup, args.tol = 256, 1, 0, 1e-4
        cases = {"pair": ([128, 128], 256), "groups": ([64] * 4, 256), "uneven": ([50, 90, 60], 256)}
    dev = jax.devices()[0]
    print(f"{_bench.device_name(dev)}; {ba.kernel_names()}", flush=True)
    notes, rows, ok = [], [], True
    if dev.platform == "gpu" and cudnn_flash.available():
        try:
            ok &= probe(args, notes)
        except Exception as e:  # noqa: BLE001 - report and go on to the checks
            notes.append(f"FAIL probe: {type(e).__name__}: {str(e)[:400]}")
            ok = False
        print("\n".join("  " + n for n in notes), flush=True)
    ok &= checks(args, notes)
    for name in [c for c in args.cases.split(",") if c]:
        seqs, t = cases[name]
        for impl in [i for i in (args.impl, args.baseline_impl) if i]:
            try:
                time_case(args, name, impl, seqs, t, rows)
            except Exception as e:  # noqa: BLE001
                notes.append(f"FAIL {name} {impl}: {type(e).__name__}: {str(e)[:300]}")  # a lost row fails the run
                print("  " + notes[-1], flush=True)
    for bound in [int(b) for b in args.bounds.split(",") if b]:
        seqs, t = cases["groups"]
        attn = ba.jax_impl(args.impl)
        seg = jnp.asarray(segments_row(seqs, t)[None])
        q, k, v, dout = ba.random_inputs(1, t, args.heads, args.kv_heads, args.head_dim, jnp.bfloat16, seed=11)
        with cudnn_packed.max_segments_per_row(bound):
            _, pfb = ba.fwd_and_grad_fns(lambda q, k, v: attn(q, k, v, seg))
            secs = median_seconds(pfb, q, k, v, dout, iters=args.iters, warmup=args.warmup)
        notes.append(f"groups with bound {bound} (needs {len(seqs)}): fwd+bwd {1e3 * secs:.1f} ms")
        print("  " + notes[-1], flush=True)
    print()
    for r in rows:
        print(fmt_row(r))
    for n in notes:
        print("-", n)
    path = _bench.record_path(args)
    if path:
        lines = [fmt_row(r) for r in rows]
        _bench.append_section(path, "packed-row attention", command=_bench.command_line(),
                              device=_bench.devices_name(), details=f"impl {args.impl}, baseline "
                              f"{args.baseline_impl or 'none'}; TFLOP/s over the causal FLOPs within sequences",
                              table=["```", *lines, "```"] if lines else [], notes=notes)
    return 0 if ok and not any("FAIL" in n for n in notes) else 1


if __name__ == "__main__":
    sys.exit(main())
