"""Where the time goes: one DisRM forward and one GRM decode step, taken apart (Qwen3-8B shapes, bf16).

    python scripts/profile_model.py                       # GPU: T=32768, decode at a 32768-token context
    python scripts/profile_model.py --smoke               # CPU, tiny model, short sequences (checks the script)
    python scripts/profile_model.py --parts forward,layer,attention --seq 131072 --no-flags
    python scripts/profile_model.py --parts prefill       # also: GRM prefill into a KV cache (slow, not default)

Parts (``--parts``, comma separated; default ``forward,layer,attention,matmuls,elementwise,decode``):

* ``forward``: ``SequenceClassifier`` forward on [1, T] (what DisRM scoring runs): the prefill section's total.
* ``layer``: one decoder layer on [1, T] (layer 0's weights, attention ``--impl``); x num_layers vs the forward
  shows what the layer scan, embedding and head add.
* ``attention``: causal attention alone, impl auto / pallas / cudnn (xla too with ``--smoke``).
* ``matmuls``: the q/k/v/o and gate/up/down matmuls alone (the model's einsums), plus fused q|k|v and gate|up
  variants (what concatenating those weights would give).
* ``elementwise``: RMSNorm [T, D], q/k norm + RoPE, silu(gate) * up [T, F], the residual add.
* ``decode``: one decode step at ``--context`` tokens (cache of context + 256 slots, as the evaluator; 8 greedy
  steps per call in a ``fori_loop``, reported per step): the decode section's total; the KV cache update alone (all layers); attention of one query over one layer of the
  stacked cache (the model's formulation and the earlier dot formulation); one layer's seven weight matvecs from
  contiguous arrays (the achievable matvec bandwidth); the LM head matvec. ``--decode-unrolled`` adds the step
  with ``unroll_cached_layers=True`` (long compile).
* ``prefill`` (opt-in): ``CausalLM`` prefill of [1, T] into a fresh KV cache, logits at the last token (GRM).

Unless ``--no-flags``, ``layer`` and the decode step run once more in a child process with XLA_FLAGS +=
``--xla_gpu_enable_dynamic_slice_fusion=true --xla_gpu_enable_triton_gemm=false`` (cuBLAS matmuls that read a
layer's weights straight out of the stacked arrays under ``scan``; without them XLA copies each layer's weight
slice every decode step). The child runs first, so its memory is free again before the main parts start.

Timing: the first call compiles (its time is the ``compile s`` column); then the median of ``--iters`` (>= 5)
samples, each ended by ``block_until_ready``; ops shorter than ~20 ms are dispatched several times back to back
per sample (dispatch cost amortised). Columns: ms per call; x = calls per forward / per decode step;
% = ms * x of the section total; TFLOP/s from the FLOPs the op must do (causal attention halved); GB/s from the
bytes it must move at least once (weights, activations in and out, the KV cache read). The table is appended to
docs/benchmarks.md (``--no-record``: print only; ``--smoke`` appends only to a file named by ``--benchmarks-md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import _bench
from longrm_jax.xla_flags import GPU_DECODE_XLA_FLAGS

ROOT = _bench.REPO_ROOT
ROW_TAG = "PROFILE_ROW "

DECODE_FLAGS = " ".join(GPU_DECODE_XLA_FLAGS)
DEFAULT_PARTS = "forward,layer,attention,matmuls,elementwise,decode"
ALL_PARTS = DEFAULT_PARTS.split(",") + ["prefill"]
DECODE_EXTRA_SLOTS = 256
STEPS_PER_CALL = 8  # decode steps per timed call (one fori_loop), reported per step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=None, help="model shapes (training.model_setup.PRESETS; default qwen3_8b)")
    p.add_argument("--seq", type=int, default=None, help="forward / layer / attention length T (default 32768)")
    p.add_argument("--context", type=int, default=None, help="decode context length (default 32768)")
    p.add_argument("--parts", default=DEFAULT_PARTS, help=f"comma-separated subset of {','.join(ALL_PARTS)}")
    p.add_argument("--impl", default="auto", help="attention impl of the model in forward/layer (default auto)")
    _bench.add_common_flags(p, iters=5, warmup=None, iters_help="timed samples per measurement (>= 5)",
                            smoke_help="tiny model on the CPU (checks the script runs)")
    p.add_argument("--decode-unrolled", action="store_true", help="also time the decode step with unrolled layers")
    p.add_argument("--no-flags", action="store_true", help="skip the child run with the decode XLA flags")
    p.add_argument("--hbm-gbps", type=float, default=None, help="HBM GB/s for the decode bound (default by device)")
    p.add_argument("--json", default=None, help="also write every row to this JSON file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # tag of a child run: print rows tagged
    p.add_argument("--decode-step-only", action="store_true", help=argparse.SUPPRESS)  # the flags child
    args = p.parse_args(argv)
    args.preset = args.preset or ("tiny_qwen3" if args.smoke else "qwen3_8b")
    args.seq = args.seq or (256 if args.smoke else 32_768)
    args.context = args.context or (256 if args.smoke else 32_768)
    args.iters = max(5, args.iters)
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = sorted(set(parts) - set(ALL_PARTS))
    if unknown:
        p.error(f"unknown parts {unknown}; valid: {ALL_PARTS}")
    args.parts = parts
    return args


# ------------------------------------------------------------------------------------------------- timing
def _block(out):
    import jax

    jax.block_until_ready(out)


def time_call(fn, *args, runs: int = 5, target_s: float = 0.02):
    """(median seconds per call, seconds of the first call incl. compile)."""
    median, first, _ = time_chain(lambda state, *a: (fn(*a), state), None, *args, runs=runs, target_s=target_s)
    return median, first


def time_chain(fn, state, *args, runs: int = 5, target_s: float = 0.02):
    """(median s per call, first call s incl. compile, final state) for ``fn(state, *args) -> (out, state)``,
    whose state may be donated and is threaded from call to call."""
    start = time.perf_counter()
    out, state = fn(state, *args)
    _block(out)
    first = time.perf_counter() - start
    start = time.perf_counter()
    out, state = fn(state, *args)
    _block(out)
    one = time.perf_counter() - start
    reps = max(1, min(200, int(target_s / max(one, 1e-7))))
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(reps):
            out, state = fn(state, *args)
        _block((out, state))
        samples.append((time.perf_counter() - start) / reps)
    return statistics.median(samples), first, state


class Recorder:
    """Collects rows; a child run prints each as a tagged JSON line for its parent."""

    def __init__(self, tag: str | None):
        self.tag = tag  # None: print rows for a person; a string (maybe empty): JSON lines for the parent
        self.rows: list[dict] = []

    def add(self, section, part, seconds=None, *, count=1, flops=None, nbytes=None, compile_s=None, note="",
            total=False):
        row = dict(section=section + (f"[{self.tag}]" if self.tag else ""), part=part,
                   ms=None if seconds is None else seconds * 1e3, count=count, flops=flops, bytes=nbytes,
                   compile_s=compile_s, note=note, total=total)
        self.rows.append(row)
        if self.tag is not None:
            print(ROW_TAG + json.dumps(row), flush=True)
        else:
            print(describe(row), flush=True)

    def measure(self, section, part, fn, *args, runs, count=1, flops=None, nbytes=None, note="", total=False):
        try:
            seconds, first = time_call(fn, *args, runs=runs)
        except Exception as e:  # noqa: BLE001 - one failing part must not lose the others
            self.add(section, part, count=count, note=f"failed: {type(e).__name__}: {str(e)[:160]}")
            return None
        self.add(section, part, seconds, count=count, flops=flops, nbytes=nbytes, compile_s=first - seconds,
                 note=note, total=total)
        return seconds


def describe(row) -> str:
    ms = "-" if row["ms"] is None else f"{row['ms']:.3f} ms"
    return f"[profile] {row['section']:>14s} | {row['part']}: {ms} {row['note']}"


# ------------------------------------------------------------------------------------------------- setup
def model_config(args, head: str, **overrides):
    from longrm_jax.models import ModelConfig
    from longrm_jax.training.model_setup import PRESETS

    fields = dict(PRESETS[args.preset])
    if args.smoke:
        fields.update(vocab_size=1024, pad_token_id=0, eos_token_id=2)
    dtype = "float32" if args.smoke else "bfloat16"
    return ModelConfig(**fields).replace(head=head, num_labels=1, dtype=dtype, param_dtype=dtype,
                                         attention_impl=args.impl, **overrides)


def build(cfg):
    import jax
    from flax import nnx

    from longrm_jax.models import build_model

    return jax.jit(lambda: build_model(cfg, rngs=nnx.Rngs(0)))()  # initialised in place on the device


def normal(key, shape, dtype, scale=1.0):
    import jax

    return jax.jit(lambda k: (scale * jax.random.normal(k, shape)).astype(dtype))(key)


def layer_flops(cfg, tokens: int, context: int, *, causal_self: bool) -> tuple[float, float]:
    """(matmul FLOPs, attention FLOPs) of one layer for ``tokens`` queries over ``context`` keys."""
    d, f, n, k, h = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    matmul = 2.0 * tokens * (d * n * h * 2 + d * k * h * 2 + 3 * d * f)
    pairs = tokens * context / 2 if causal_self else tokens * context
    return matmul, 4.0 * pairs * n * h


# ------------------------------------------------------------------------------------------------- parts
def part_prefill_side(args, rec: Recorder, parts):
    """forward, layer, attention, matmuls, elementwise (section ``prefill``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from longrm_jax.models.layers import layer_forward, rms_norm
    from longrm_jax.models.rope import apply_rope, rope_cos_sin, rope_parameters
    from longrm_jax.ops import attention

    cfg = model_config(args, "classifier")
    t, dt, sec = args.seq, cfg.compute_dtype, "prefill"
    d, f, n, k, h, L = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                        cfg.num_layers)
    item = np.dtype(dt).itemsize
    mm_flops, attn_flops = layer_flops(cfg, t, t, causal_self=True)
    model = build(cfg)
    ids = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (1, t)), jnp.int32)
    if "forward" in parts:
        weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model))
        rec.measure(sec, f"classifier forward [1,{t}]", jax.jit(lambda m, i: m(i)), model, ids, runs=args.iters,
                    flops=L * (mm_flops + attn_flops), nbytes=weights, total=True,
                    note=f"{t / 1:.0f} tokens per call")
    p0 = jax.jit(lambda m: jax.tree.map(lambda a: a[0], m.model.layers.stacked()))(model)
    del model
    keys = jax.random.split(jax.random.key(0), 8)
    x = normal(keys[0], (1, t, d), dt)
    inv_freq, factor = rope_parameters(cfg)
    cos, sin = rope_cos_sin(jnp.arange(t, dtype=jnp.int32)[None], inv_freq, factor, dt)
    if "layer" in parts:
        def one_layer(p, x, cos, sin):
            def attend(q, kk, v):
                return attention(q, kk, v, causal=True, impl=cfg.attention_impl), None
            return layer_forward(p, x, cos, sin, cfg, None, attend)[0]

        layer_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(p0)) + 2 * t * d * item
        rec.measure(sec, f"one decoder layer (impl {args.impl})", jax.jit(one_layer), p0, x, cos, sin,
                    runs=args.iters, count=L, flops=mm_flops + attn_flops, nbytes=layer_bytes)
    if "attention" in parts:
        q = normal(keys[1], (1, t, n, h), dt)
        kk = normal(keys[2], (1, t, k, h), dt)
        v = normal(keys[3], (1, t, k, h), dt)
        impls = ["auto", "xla"] if args.smoke else ["auto", "pallas", "cudnn"]
        from longrm_jax.ops import resolve_impl

        for impl in impls:
            fn = jax.jit(lambda q, kk, v, impl=impl: attention(q, kk, v, causal=True, impl=impl))
            rec.measure(sec, f"attention {impl} ({resolve_impl(impl)})", fn, q, kk, v, runs=args.iters, count=L,
                        flops=attn_flops, nbytes=(2 * t * n * h + 2 * t * k * h) * item)
    if "matmuls" in parts:
        hq = normal(keys[4], (1, t, n, h), dt)
        act = normal(keys[5], (1, t, f), dt)
        specs = [  # (name, einsum, lhs, weight)
            ("q_proj", "btd,dnh->btnh", x, p0["q_proj"]), ("k_proj", "btd,dkh->btkh", x, p0["k_proj"]),
            ("v_proj", "btd,dkh->btkh", x, p0["v_proj"]), ("o_proj", "btnh,nhd->btd", hq, p0["o_proj"]),
            ("gate_proj", "btd,df->btf", x, p0["gate_proj"]), ("up_proj", "btd,df->btf", x, p0["up_proj"]),
            ("down_proj", "btf,fd->btd", act, p0["down_proj"]),
            ("fused q|k|v (not in the model)", "btd,de->bte", x,
             jnp.concatenate([p0["q_proj"].reshape(d, -1), p0["k_proj"].reshape(d, -1),
                              p0["v_proj"].reshape(d, -1)], axis=1)),
            ("fused gate|up (not in the model)", "btd,de->bte", x,
             jnp.concatenate([p0["gate_proj"], p0["up_proj"]], axis=1)),
        ]
        for name, eq, lhs, w in specs:
            fan_in = lhs.size // t
            fan_out = w.size // fan_in
            count = 0 if "fused" in name else L
            rec.measure(sec, f"matmul {name} [{t}x{fan_in}]x[{fan_in}x{fan_out}]",
                        jax.jit(lambda a, b, eq=eq: jnp.einsum(eq, a, b)), lhs, w, runs=args.iters, count=count,
                        flops=2.0 * t * fan_in * fan_out, nbytes=(t * fan_in + w.size + t * fan_out) * item)
    if "elementwise" in parts:
        q = normal(keys[1], (1, t, n, h), dt)
        kk = normal(keys[2], (1, t, k, h), dt)
        gate, up = normal(keys[6], (1, t, f), dt), normal(keys[7], (1, t, f), dt)
        eps = cfg.rms_norm_eps
        rec.measure(sec, f"rms_norm [{t},{d}]", jax.jit(lambda x, w: rms_norm(x, w, eps)), x, p0["attn_norm"],
                    runs=args.iters, count=2 * L, nbytes=2 * t * d * item)

        def qk_norm_rope(q, kk, qn, kn, cos, sin):
            if cfg.qk_norm:
                q, kk = rms_norm(q, qn, eps), rms_norm(kk, kn, eps)
            return apply_rope(q, cos, sin), apply_rope(kk, cos, sin)

        qn = p0.get("q_norm", jnp.ones((h,), dt))
        kn = p0.get("k_norm", jnp.ones((h,), dt))
        rec.measure(sec, "q/k norm + RoPE", jax.jit(qk_norm_rope), q, kk, qn, kn, cos, sin, runs=args.iters,
                    count=L, nbytes=2 * t * (n + k) * h * item + 2 * t * h * item)
        rec.measure(sec, f"silu(gate) * up [{t},{f}]", jax.jit(lambda g, u: jax.nn.silu(g) * u), gate, up,
                    runs=args.iters, count=L, nbytes=3 * t * f * item)
        rec.measure(sec, "residual add", jax.jit(lambda a, b: a + b), x, x, runs=args.iters, count=2 * L,
                    nbytes=3 * t * d * item)


def _dot_single_query(q_btnh, k_bskh, v_bskh, mask_bts):
    """The pre-fix decode attention (einsum dots), kept here for comparison."""
    import jax
    import jax.numpy as jnp

    b, t, n, h = q_btnh.shape
    kv = k_bskh.shape[2]
    qg = q_btnh.reshape(b, t, kv, n // kv, h)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k_bskh, preferred_element_type=jnp.float32) * h**-0.5
    scores = jnp.where(mask_bts[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_bskh.dtype)
    return jnp.einsum("bkgts,bskh->btkgh", probs, v_bskh).reshape(b, t, n, h)


def part_decode(args, rec: Recorder):
    """One decode step at ``--context`` and its pieces (section ``decode``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from longrm_jax.models.layers import masked_attention

    cfg = model_config(args, "causal_lm")
    d, f, n, k, h, L, vocab = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                               cfg.head_dim, cfg.num_layers, cfg.vocab_size)
    ctx, slots, dt, sec = args.context, args.context + DECODE_EXTRA_SLOTS, cfg.compute_dtype, "decode"
    item = np.dtype(dt).itemsize
    model = build(cfg)
    keys = jax.random.split(jax.random.key(1), 6)
    shape = (L, 1, slots, k, h)
    cache = dataclasses.replace(
        model.init_cache(1, slots), k=normal(keys[0], shape, dt), v=normal(keys[1], shape, dt),
        positions=jnp.arange(slots, dtype=jnp.int32)[None],
        segment_ids=(jnp.arange(slots) < ctx).astype(jnp.int32)[None], index=jnp.asarray(ctx, jnp.int32))
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model))
    if not cfg.tie_word_embeddings:
        weight_bytes -= vocab * d * item  # a step reads one embedding row
    cache_bytes = 2 * L * slots * k * h * item
    token = jnp.asarray([[5]], jnp.int32)
    pos = jnp.asarray([[ctx]], jnp.int32)
    bandwidth = args.hbm_gbps * 1e9 if args.hbm_gbps else _bench.hbm_bandwidth(jax.devices()[0].device_kind)
    bound = f"HBM bound {(weight_bytes + cache_bytes) / bandwidth * 1e3:.2f} ms" if bandwidth else ""

    def steps(cache, model, token, pos):
        """STEPS_PER_CALL greedy steps in one ``fori_loop`` (as the evaluator's while loop: what XLA hoists out
        of the loop, e.g. weight layout changes, is paid once per call, not per step)."""
        def body(_, carry):
            cache, token = carry
            logits, cache = model(token, positions=pos, segment_ids=jnp.ones_like(token), cache=cache)
            # Stay at the same context length, so every timed step does the same work.
            cache = dataclasses.replace(cache, index=cache.index - 1)
            return cache, jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]

        cache, token = jax.lax.fori_loop(0, STEPS_PER_CALL, body, (cache, token))
        return token, cache

    mm_flops, attn_flops = layer_flops(cfg, 1, slots, causal_self=False)
    variants = [("decode step", model)]
    if args.decode_unrolled:
        variants.append(("decode step, unrolled layers", build(cfg.replace(unroll_cached_layers=True))))
    for name, m in variants:
        try:
            seconds, first, cache = time_chain(jax.jit(steps, donate_argnums=(0,)), cache, m, token, pos,
                                               runs=args.iters)
            seconds, first = seconds / STEPS_PER_CALL, first - seconds + seconds / STEPS_PER_CALL
            rec.add(sec, f"{name} @ {ctx} ctx", seconds, flops=L * (mm_flops + attn_flops) + 2 * d * vocab,
                    nbytes=weight_bytes + cache_bytes, compile_s=first - seconds, note=bound,
                    total=name == "decode step")
        except Exception as e:  # noqa: BLE001
            rec.add(sec, name, note=f"failed: {type(e).__name__}: {str(e)[:160]}")
    if args.decode_step_only:
        return

    def update(kv, new, idx):
        k_all, v_all = kv
        zero = jnp.zeros((), jnp.int32)
        for i in range(L):  # what a step writes: one slot per layer, keys and values
            k_all = jax.lax.dynamic_update_slice(k_all, new[i][None], (i, zero, idx, zero, zero))
            v_all = jax.lax.dynamic_update_slice(v_all, new[i][None], (i, zero, idx, zero, zero))
        return k_all[0, 0, 0, 0, 0], (k_all, v_all)

    new = normal(keys[2], (L, 1, 1, k, h), dt)
    try:
        seconds, first, kv = time_chain(jax.jit(update, donate_argnums=(0,)), (cache.k, cache.v), new,
                                        jnp.asarray(ctx, jnp.int32), runs=args.iters)
        cache = dataclasses.replace(cache, k=kv[0], v=kv[1])
        rec.add(sec, "KV cache update alone (all layers)", seconds, nbytes=2 * L * k * h * item,
                compile_s=first - seconds, note="in place: should be ~launch cost")
    except Exception as e:  # noqa: BLE001
        rec.add(sec, "KV cache update alone", note=f"failed: {type(e).__name__}: {str(e)[:160]}")

    q = normal(keys[3], (1, 1, n, h), dt)
    mask = cache.attention_mask(pos, jnp.ones_like(pos), 1)
    layer_kv_bytes = 2 * slots * k * h * item
    for name, fn in [("model formulation", masked_attention), ("dot formulation (before the fix)",
                                                               _dot_single_query)]:
        rec.measure(sec, f"1-query attention over a cache layer, {name}",
                    jax.jit(lambda q, ka, va, m, fn=fn: fn(q, ka[L // 2], va[L // 2], m)), q, cache.k, cache.v,
                    mask, runs=args.iters, count=L if name == "model formulation" else 0, flops=attn_flops,
                    nbytes=layer_kv_bytes)

    stacked = model.model.layers.stacked()
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ws = jax.jit(lambda s: [s[nm][L // 2] for nm in names])(stacked)  # contiguous copies of one layer

    def matvecs(x, xf, xa, ws):
        wq, wk, wv, wo, wg, wu, wd = ws
        return (jnp.einsum("btd,dnh->btnh", x, wq), jnp.einsum("btd,dkh->btkh", x, wk),
                jnp.einsum("btd,dkh->btkh", x, wv), jnp.einsum("btnh,nhd->btd", xa, wo),
                jnp.einsum("btd,df->btf", x, wg), jnp.einsum("btd,df->btf", x, wu),
                jnp.einsum("btf,fd->btd", xf, wd))

    x1, xf, xa = normal(keys[4], (1, 1, d), dt), normal(keys[5], (1, 1, f), dt), q
    rec.measure(sec, "one layer's 7 weight matvecs (contiguous weights)", jax.jit(matvecs), x1, xf, xa, ws,
                runs=args.iters, count=L, flops=mm_flops, nbytes=sum(w.size for w in ws) * item)
    head = model.lm_head_weight()
    rec.measure(sec, f"LM head matvec [{d}x{vocab}]", jax.jit(lambda x, w: x @ w), x1[0], head, runs=args.iters,
                flops=2.0 * d * vocab, nbytes=d * vocab * item)


def part_grm_prefill(args, rec: Recorder):
    """CausalLM prefill into a fresh cache (what GreedyGenerator's prefill runs)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    cfg = model_config(args, "causal_lm")
    t = args.seq
    model = build(cfg)
    ids = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (1, t)), jnp.int32)
    positions = jnp.arange(t, dtype=jnp.int32)[None]

    def prefill(m, ids, positions):
        cache = m.init_cache(1, t + DECODE_EXTRA_SLOTS)
        logits, cache = m(ids, positions=positions, cache=cache, prefill=True,
                          logits_at=jnp.asarray([t - 1], jnp.int32))
        return logits, cache

    mm_flops, attn_flops = layer_flops(cfg, t, t, causal_self=True)
    rec.measure("prefill", f"GRM prefill into a KV cache [1,{t}]", jax.jit(prefill), model, ids, positions,
                runs=args.iters, count=0, flops=cfg.num_layers * (mm_flops + attn_flops))


# ------------------------------------------------------------------------------------------------- report
def format_table(rows) -> list[str]:
    totals = {}
    for r in rows:
        if r["total"] and r["ms"]:
            totals[r["section"]] = r["ms"]
    lines = ["| section | part | ms | x | % of total | TFLOP/s | GB/s | compile s | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        total = totals.get(r["section"]) or totals.get(r["section"].split("[")[0])
        ms = r["ms"]
        if ms is None:
            lines.append(f"| {r['section']} | {r['part']} | - | | | | | | {r['note']} |")
            continue
        share = f"{100 * ms * r['count'] / total:.1f}%" if total and r["count"] and not r["total"] else (
            "100%" if r["total"] else "")
        tflops = f"{r['flops'] / ms / 1e9:.1f}" if r["flops"] else ""
        gbps = f"{r['bytes'] / ms / 1e6:.0f}" if r["bytes"] else ""
        comp = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else ""
        lines.append(f"| {r['section']} | {r['part']} | {ms:.3f} | {r['count']} | {share} | {tflops} | {gbps} | "
                     f"{comp} | {r['note']} |")
    return lines


def run_child(args, tag: str, parts: list[str], extra_flags: str) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", tag, "--parts", ",".join(parts), "--preset",
           args.preset, "--seq", str(args.seq), "--context", str(args.context), "--impl", args.impl,
           "--iters", str(args.iters), "--no-flags", "--no-record"]
    if args.smoke:
        cmd.append("--smoke")
    if tag == "flags":  # keep the GPU run short: the step and the layer are what the flags change
        cmd.append("--decode-step-only")
    if args.hbm_gbps:
        cmd += ["--hbm-gbps", str(args.hbm_gbps)]
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + extra_flags).strip()
    print(f"[profile] child '{tag}' with XLA_FLAGS={env['XLA_FLAGS']!r}: {','.join(parts)}", flush=True)
    rows = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT) as proc:
        for line in proc.stdout:  # rows as they come (progress), other output passed through
            if line.startswith(ROW_TAG):
                rows.append(json.loads(line[len(ROW_TAG):]))
                print(describe(rows[-1]), flush=True)
            else:
                print(line, end="", flush=True)
    if proc.returncode:
        print(f"[profile] child '{tag}' exited {proc.returncode} (rows so far kept)", file=sys.stderr, flush=True)
    return rows


def run_parts(args, rec: Recorder):
    prefill_side = [p for p in args.parts if p in ("forward", "layer", "attention", "matmuls", "elementwise")]
    if prefill_side:
        part_prefill_side(args, rec, prefill_side)
    if "decode" in args.parts:
        part_decode(args, rec)
    if "prefill" in args.parts:
        part_grm_prefill(args, rec)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # Children and parent share the GPU one after the other: no up-front 75% grab.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.child is not None:
        try:  # tokamax (the pallas kernels) imports xprof, which GPU hosts may lack
            import xprof  # noqa: F401
        except ImportError:
            from longrm_jax.ops.flash import register_xprof_stub

            register_xprof_stub()
        run_parts(args, Recorder(args.child))
        return 0
    started = time.perf_counter()
    rows = []
    flag_parts = [p for p in ("layer", "decode") if p in args.parts]
    if not args.no_flags and flag_parts:  # first: its memory is released before the main parts allocate
        rows += run_child(args, "flags", flag_parts, "" if args.smoke else DECODE_FLAGS)
    # The main parts also run in a child, so that a crash (e.g. out of memory) keeps what was measured.
    rows = run_child(args, "", args.parts, "") + rows
    import jax

    details = (f"{args.preset} shapes, {'fp32' if args.smoke else 'bf16'}, random weights, T={args.seq}, decode "
               f"context {args.context}, jax {jax.__version__}; [flags] rows: XLA_FLAGS += `{DECODE_FLAGS}`; "
               f"wall {time.perf_counter() - started:.0f} s.")
    table = format_table(rows)
    print(f"\n{_bench.devices_name()}: {details}\n\n" + "\n".join(table))
    path = _bench.record_path(args)
    if path:
        _bench.append_section(path, "model profile", command=_bench.command_line(argv),
                              device=_bench.devices_name(), details=details, table=table)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0 if rows and all(r["ms"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
