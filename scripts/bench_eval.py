"""Benchmark the evaluator: DisRM scoring tokens/s (vs the PyTorch peer) and GRM decode tokens/s (vs the bound).

    python scripts/bench_eval.py                 # GPU: Qwen3-8B shapes, random weights, bf16
    python scripts/bench_eval.py --smoke         # tiny model on the CPU (seconds; checks the script runs)

Measured, each in its own subprocess (so one framework's memory never limits the other's):

* ``disrm-jax``: ``DisRMScorer`` (jitted, one 1 x L bucket) scoring ``--sequences`` sequences of L tokens,
  for L in ``--lengths`` (default 32K and 128K); compile excluded (a warm-up pass first).
* ``disrm-shared-jax``: the evaluator's ``--share-prompt`` path on pairs of L-token sequences that differ only
  in their last 512 tokens (a pairwise sample's two answers); effective tokens/s (both sequences' tokens).
* ``disrm-torch``: the PyTorch peer: transformers ``*ForSequenceClassification`` with SDPA attention, same
  shapes, dtype and sequences, ``torch.inference_mode``, one sequence per forward.
* ``decode-jax``: ``GreedyGenerator``'s decode loop (``lax.while_loop``, preallocated KV cache) after a prefill
  of ``--decode-context`` tokens, ``--decode-steps`` new tokens for ``--decode-batch`` rows (a stop id that
  never occurs, so every step runs). Reported against the memory-bandwidth bound: each step must read every
  weight (the untied embedding table excepted: one row) and the whole KV cache buffer once,
  ``bound tokens/s = batch * HBM bandwidth / (weight bytes + KV cache bytes)``. Runs with the GPU decode XLA
  flags (``longrm_jax.xla_flags``), as the evaluator's GRM path does (``--decode-no-gpu-flags``: without).

FLOPs per scored token follow docs/flops.md: forward = a third of ``6 N + 6 L H d S`` per token
= ``2 N + 2 L H d S`` (the attention term is already the causal half; not halved again). Weights are
initialised in place on the device (no checkpoint I/O). Prints a table and appends it to docs/benchmarks.md
(``--no-record`` to skip; ``--smoke`` appends only to a file named by ``--benchmarks-md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sys
import time

import _bench
import bench_benchmark  # the --benchmark mode (scripts/bench_benchmark.py)

ROOT = _bench.REPO_ROOT
RESULT_TAG = "BENCH_RESULT "
SHARED_SUFFIX = 512  # answer tokens per sequence in the --share-prompt measurement


# ------------------------------------------------------------------------------------------------- configs
def model_config(args, head: str):
    """ModelConfig of the benchmarked shapes (``--preset``), head and dtype set."""
    from longrm_jax.models import ModelConfig
    from longrm_jax.training.model_setup import PRESETS

    fields = dict(PRESETS[args.preset])
    if args.smoke:
        fields.update(vocab_size=1024, pad_token_id=0, eos_token_id=2)
    dtype = "float32" if args.smoke else "bfloat16"
    return ModelConfig(**fields).replace(head=head, num_labels=1, dtype=dtype, param_dtype=dtype)


def forward_flops_per_token(cfg, head: str, seq_len: int) -> float:
    """Forward FLOPs per token of a causal ``seq_len``-token sequence (docs/flops.md).

    ``(6 N + 6 L H_q d S) / 3 = 2 N + 2 L H_q d S``: the attention term ``6 L H_q d S`` is already the causally
    halved ``12 L H_q d S / 2``, so it must not be halved again (an earlier version did, under-reporting
    TFLOP/s by ~20% at 32K). ``N`` = matmul parameters without the embedding lookup (head included).
    """
    from longrm_jax.training.telemetry import matmul_params

    attention = cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
    return 2.0 * matmul_params(cfg, head) + 2.0 * attention


def count_for(args, seq_len: int) -> int:
    """Sequences (or pairs) measured at ``seq_len``: ``--sequences``, else 4 up to 32K tokens and 2 beyond."""
    if args.sequences:
        return args.sequences
    return 3 if args.smoke else (4 if seq_len <= 32_768 else 2)


def random_sequences(cfg, count: int, length: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    # Token ids >= 3 and != pad: the pooled token is always the last one.
    seqs = [rng.integers(3, cfg.vocab_size, length).astype(np.int32) for _ in range(count)]
    for s in seqs:
        s[s == cfg.pad_token_id] = 3
    return seqs


# ---------------------------------------------------------------------------------------------------- parts
def part_disrm_jax(args) -> dict:
    import jax
    from flax import nnx

    from longrm_jax.evaluation.scoring import DisRMScorer
    from longrm_jax.models import build_model

    cfg = model_config(args, "classifier")
    model = jax.jit(lambda: build_model(cfg, rngs=nnx.Rngs(0)))()  # initialised in place on the device
    scorer = DisRMScorer(model, cfg.pad_token_id, batch_size=1, max_batch_tokens=None)
    seqs = random_sequences(cfg, count_for(args, args.seq), args.seq)
    scorer.score(seqs[:1], progress=False)  # compile
    for _ in range(args.warmup):
        scorer.score(seqs[:1], progress=False)
    start = time.perf_counter()
    scorer.score(seqs, progress=False)  # returns host numpy: synchronised
    seconds = time.perf_counter() - start
    tokens = args.seq * len(seqs)
    return dict(tokens=tokens, seconds=seconds, flops=forward_flops_per_token(cfg, "classifier", args.seq) * tokens,
                device=jax.devices()[0].device_kind)


def part_disrm_shared_jax(args) -> dict:
    """``--share-prompt``: pairs of L-token sequences that share all but their last ``SUFFIX`` tokens."""
    import jax
    import numpy as np
    from flax import nnx

    from longrm_jax.evaluation.shared_prompt import SharedPromptScorer
    from longrm_jax.models import build_model

    cfg = model_config(args, "classifier")
    model = jax.jit(lambda: build_model(cfg, rngs=nnx.Rngs(0)))()
    scorer = SharedPromptScorer(model, cfg.pad_token_id)
    suffix = min(SHARED_SUFFIX, args.seq // 4)
    groups = []
    for i, prompt in enumerate(random_sequences(cfg, count_for(args, args.seq), args.seq - suffix)):
        answers = random_sequences(cfg, 2, suffix, seed=1000 + i)
        groups.append([np.concatenate([prompt, a]) for a in answers])
    scorer.score_group(groups[0])  # compile
    for _ in range(args.warmup):
        scorer.score_group(groups[0])
    start = time.perf_counter()
    for group in groups:
        scorer.score_group(group)
    seconds = time.perf_counter() - start
    tokens = 2 * args.seq * len(groups)  # tokens of the sequences scored (what one-by-one scoring processes)
    return dict(tokens=tokens, seconds=seconds, device=jax.devices()[0].device_kind, suffix=suffix,
                flops=forward_flops_per_token(cfg, "classifier", args.seq) * tokens)


def part_disrm_torch(args) -> dict:
    import torch
    import transformers

    from longrm_jax.models.config import to_hf_config

    cfg = model_config(args, "classifier")
    hf = to_hf_config(cfg)
    config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
    model = model.to(dtype).eval()
    seqs = [torch.tensor(s[None].astype("int64"), device=device)
            for s in random_sequences(cfg, count_for(args, args.seq), args.seq)]

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        for _ in range(1 + args.warmup):  # as the JAX side: a first pass, then --warmup more
            model(seqs[0]).logits.float().cpu()
        sync()
        start = time.perf_counter()
        for ids in seqs:
            model(ids).logits.float().cpu()
        sync()
        seconds = time.perf_counter() - start
    tokens = args.seq * len(seqs)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return dict(tokens=tokens, seconds=seconds, flops=forward_flops_per_token(cfg, "classifier", args.seq) * tokens,
                device=name, torch=torch.__version__, transformers=transformers.__version__)


def part_decode_jax(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from longrm_jax.evaluation.batching import Batch, pad_rows
    from longrm_jax.evaluation.grm.generation import GreedyGenerator, prepare_for_decoding
    from longrm_jax.evaluation.grm.decoding import letter_logprobs
    from longrm_jax.models import build_model

    cfg = model_config(args, "causal_lm")
    model = jax.jit(lambda: build_model(cfg, rngs=nnx.Rngs(0)))()
    if not args.decode_unfused:  # the evaluator's layout for a generative judge (fused q/k/v and gate/up)
        prepare_for_decoding(model, None, args.decode_attention)
    else:
        model.use_decode_attention("xla" if args.decode_attention == "auto" else args.decode_attention)
    never = cfg.vocab_size + 7  # a stop id no row can emit: every step runs
    steps, batch_rows, context = args.decode_steps, args.decode_batch, args.decode_context
    gen = GreedyGenerator(model, pad_id=cfg.pad_token_id, stop_ids=[never], max_new_tokens=steps,
                          letter_ids=[3, 4], batch_size=batch_rows, max_batch_tokens=None)
    prompts = random_sequences(cfg, batch_rows, context)
    ids, lengths = pad_rows(prompts, Batch(context, batch_rows, tuple(range(batch_rows))), cfg.pad_token_id)
    ids, positions, last = gen._prefill_inputs(ids, lengths)
    prefill = gen._prefill_fn(context + steps)
    # Rows prefilled per call: all at once while that is at most 128K tokens; beyond, one row per call written
    # straight into its row of the batch's cache (``write_at``, as the evaluator's continuous pool admits a
    # prompt): no cache of the row beside the batch's, which at 128K is 18 GiB more for Qwen3-8B (a 2 x 128K
    # batch ran an H100 out of memory that way). Decode, the measured part, is the same either way.
    group = args.decode_prefill_rows or (batch_rows if batch_rows * context <= 131_072 else 1)
    if batch_rows % group:
        raise SystemExit(f"--decode-prefill-rows {group} must divide --decode-batch {batch_rows}")

    @functools.partial(jax.jit, donate_argnums=(0,))
    def place(cache, part, row):
        at = lambda full, new, axis: jax.lax.dynamic_update_slice_in_dim(full, new, row, axis)  # noqa: E731
        return dataclasses.replace(cache, k=at(cache.k, part.k, 1), v=at(cache.v, part.v, 1),
                                   positions=at(cache.positions, part.positions, 0),
                                   segment_ids=at(cache.segment_ids, part.segment_ids, 0), index=part.index)

    @functools.partial(jax.jit, donate_argnums=(1,))
    def prefill_into(model, cache, row_ids, row_positions, row_last, row):
        span = row_ids.shape[1]
        logits, cache = model(row_ids, positions=row_positions, cache=cache, prefill=True, logits_at=row_last,
                              write_at=(row, jnp.arange(span, dtype=jnp.int32)))
        meta = lambda full, new: jax.lax.dynamic_update_slice(full, new, (row, jnp.zeros((), jnp.int32)))  # noqa: E731
        cache = dataclasses.replace(cache, positions=meta(cache.positions, row_positions.astype(jnp.int32)),
                                    segment_ids=meta(cache.segment_ids, jnp.ones_like(row_ids, jnp.int32)),
                                    index=jnp.asarray(span, jnp.int32))
        last = logits[:, 0]
        return cache, jnp.argmax(last, axis=-1).astype(jnp.int32), letter_logprobs(last, gen.letter_ids)

    def prefill_all():
        if group == batch_rows:
            return prefill(model, ids, positions, last, gen.letter_ids)
        cache = jax.jit(lambda: model.init_cache(batch_rows, context + steps))()
        firsts, letters = [], []
        for row in range(0, batch_rows, group):
            rows = slice(row, row + group)
            if group == 1:
                cache, first, letter = prefill_into(model, cache, ids[rows], positions[rows], last[rows],
                                                    jnp.asarray(row, jnp.int32))
            else:
                part, first, letter = prefill(model, ids[rows], positions[rows], last[rows], gen.letter_ids)
                cache = place(cache, part, row)
                del part
            firsts.append(first)
            letters.append(letter)
        return cache, jnp.concatenate(firsts), jnp.concatenate(letters)

    def run():
        start = time.perf_counter()
        cache, first, letters = prefill_all()
        first.block_until_ready()
        mid = time.perf_counter()
        tokens, _, taken, _ = gen._decode(model, cache, first, letters, lengths, gen.stop_ids, gen.letter_ids)
        tokens.block_until_ready()
        return mid - start, time.perf_counter() - mid, int(taken), np.asarray(tokens)

    run()  # compile both
    for _ in range(args.warmup):
        run()
    prefill_s, decode_s, taken, tokens = run()
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    if not cfg.tie_word_embeddings:  # a step reads one embedding row, not the table
        weight_bytes -= cfg.vocab_size * cfg.hidden_size * np.dtype(cfg.param_dtype).itemsize
    cache_bytes = 2 * cfg.num_layers * batch_rows * (context + steps) * cfg.num_kv_heads * cfg.head_dim * \
        np.dtype(cfg.compute_dtype).itemsize
    kind = jax.devices()[0].device_kind
    bandwidth = args.hbm_gbps * 1e9 if args.hbm_gbps else _bench.hbm_bandwidth(kind)
    decoded = batch_rows * (taken - 1)  # the first new token comes from the prefill
    return dict(prefill_tokens=batch_rows * context, prefill_seconds=prefill_s, decode_tokens=decoded,
                decode_seconds=decode_s, weight_bytes=weight_bytes, cache_bytes=int(cache_bytes),
                bound_tokens_per_s=None if bandwidth is None else batch_rows * bandwidth / (weight_bytes + cache_bytes),
                bandwidth=bandwidth, device=kind, xla_flags=os.environ.get("XLA_FLAGS", ""),
                decode_attention=model.config.decode_attention,
                # the tokens' digest: prefill layouts (--decode-prefill-rows) must give the same greedy tokens
                tokens_digest=hashlib.sha256(tokens.astype(np.int32).tobytes()).hexdigest()[:16])


PARTS = {"disrm-jax": part_disrm_jax, "disrm-shared-jax": part_disrm_shared_jax, "disrm-torch": part_disrm_torch,
         "decode-jax": part_decode_jax}


# ------------------------------------------------------------------------------------------------- driver
def run_part(args, part: str, seq: int | None = None) -> dict | None:
    """Run one measurement in a fresh interpreter (``--smoke``: in this one, nothing to isolate on the CPU);
    returns its result dict, or None (error printed)."""
    if args.smoke:
        print(f"[bench_eval] {part}" + (f" L={seq}" if seq else ""), flush=True)
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        return PARTS[part](argparse.Namespace(**{**vars(args), "seq": seq}))
    cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--preset", args.preset,
           "--decode-context", str(args.decode_context),
           "--decode-steps", str(args.decode_steps), "--decode-batch", str(args.decode_batch)]
    if seq is not None:
        cmd += ["--seq", str(seq)]
    if args.smoke:
        cmd.append("--smoke")
    if args.sequences:
        cmd += ["--sequences", str(args.sequences)]
    cmd += ["--warmup", str(args.warmup)]
    if args.hbm_gbps:
        cmd += ["--hbm-gbps", str(args.hbm_gbps)]
    if args.decode_unfused:
        cmd.append("--decode-unfused")
    cmd += ["--decode-attention", args.decode_attention]
    if args.decode_prefill_rows:
        cmd += ["--decode-prefill-rows", str(args.decode_prefill_rows)]
    env = dict(os.environ)
    if args.smoke:
        env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    if part == "decode-jax" and not args.decode_no_gpu_flags:  # what the evaluator's GRM path runs with
        from longrm_jax.xla_flags import add_gpu_xla_flags

        add_gpu_xla_flags(environ=env)
    print(f"[bench_eval] {part}" + (f" L={seq}" if seq else ""), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    print(f"[bench_eval] {part} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def peak_flops(device: str) -> float | None:
    from longrm_jax.training.telemetry import PEAK_FLOPS

    return next((v for k, v in PEAK_FLOPS.items() if k in device), None)


def report_device(disrm: dict, decode: dict | None) -> str:
    """The device kind the measurements ran on (reported by the child processes)."""
    return next((r["device"] for pair in disrm.values() for r in pair if r), decode["device"] if decode else "?")


def report_details(args) -> str:
    shape = "tiny (smoke)" if args.smoke else args.preset
    return f"{shape} shapes, random weights initialised in place, {'fp32' if args.smoke else 'bf16'}"


def build_report(args, disrm: dict, decode: dict | None, shared: dict | None = None) -> list[str]:
    """The report's tables (markdown lines)."""
    lines = ["DisRM scoring (batch 1, one bucket of exactly L tokens, compile excluded):", "",
              "| L | sequences | ours tokens/s | ours TFLOP/s (MFU) | PyTorch SDPA tokens/s | TFLOP/s (MFU) | ours / peer |",
              "|---:|---:|---:|---:|---:|---:|---:|"] if disrm else []

    def rate(r):
        if not r:
            return "failed", "-", None
        tps = r["tokens"] / r["seconds"]
        tflops = r["flops"] / r["seconds"]
        peak = peak_flops(r["device"])
        mfu = f" ({100 * tflops / peak:.1f}%)" if peak else ""
        return f"{tps:,.0f}", f"{tflops / 1e12:.1f}{mfu}", tps

    for seq, (ours, peer) in disrm.items():
        o_tps, o_fl, o_val = rate(ours)
        p_tps, p_fl, p_val = rate(peer) if peer is not None else ("skipped", "-", None)
        ratio = f"{o_val / p_val:.2f}x" if o_val and p_val else "-"
        lines.append(f"| {seq} | {count_for(args, seq)} | {o_tps} | {o_fl} | {p_tps} | {p_fl} | {ratio} |")
    if shared:
        suffix = next((r["suffix"] for r in shared.values() if r), SHARED_SUFFIX)
        lines += ["", f"DisRM `--share-prompt` (pairs of L-token sequences differing in their last {suffix} "
                      "tokens, one prompt prefill per pair; tokens/s counts both sequences' tokens, TFLOP/s "
                      "the FLOPs of scoring them one by one, i.e. effective):", "",
                  "| L | pairs | effective tokens/s | effective TFLOP/s | vs PyTorch SDPA one by one |",
                  "|---:|---:|---:|---:|---:|"]
        for seq, result in shared.items():
            s_tps, s_fl, s_val = rate(result)
            peer = disrm.get(seq, (None, None))[1]
            p_val = rate(peer)[2] if peer else None
            ratio = f"{s_val / p_val:.2f}x" if s_val and p_val else "-"
            lines.append(f"| {seq} | {count_for(args, seq)} | {s_tps} | {s_fl} | {ratio} |")
    if decode is not None:
        tps = decode["decode_tokens"] / decode["decode_seconds"]
        bound = decode["bound_tokens_per_s"]
        frac = f"{100 * tps / bound:.0f}%" if bound else "-"
        bound_text = f"{bound:,.1f}" if bound else "-"
        hbm = f"{decode['bandwidth'] / 1e12:.2f}" if decode["bandwidth"] else "-"
        flags = decode.get("xla_flags") or "none"
        lines += ["", f"GRM greedy decode at {args.decode_context}-token context, batch {args.decode_batch}, "
                      f"{args.decode_steps} new tokens, {'separate' if args.decode_unfused else 'fused'} projections, "
                      f"decode attention {decode.get('decode_attention', '?')} "
                      f"(prefill {decode['prefill_tokens'] / decode['prefill_seconds']:,.0f} tokens/s; "
                      f"XLA_FLAGS: {flags}):", "",
                  "| decode tokens/s | bound tokens/s | of bound | weights GB | KV cache GB | HBM TB/s |",
                  "|---:|---:|---:|---:|---:|---:|",
                  f"| {tps:,.1f} | {bound_text} | {frac} | {decode['weight_bytes'] / 1e9:.2f} | "
                  f"{decode['cache_bytes'] / 1e9:.2f} | {hbm} |"]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3_8b", help="model shapes (longrm_jax.training.model_setup.PRESETS)")
    p.add_argument("--lengths", type=int, nargs="*", default=None,
                   help="DisRM sequence lengths (default 32768 131072; none: skip DisRM scoring)")
    p.add_argument("--sequences", type=int, default=None, help="sequences scored per length (default 4 up to 32K tokens, 2 beyond; smoke 3)")
    _bench.add_common_flags(p, iters=None, warmup=2,
                            smoke_help="tiny model on the CPU, short sequences (checks the script)")
    p.add_argument("--decode-context", type=int, default=None, help="GRM prompt tokens (default 32768)")
    p.add_argument("--decode-steps", type=int, default=None, help="GRM new tokens (default 256)")
    p.add_argument("--decode-batch", type=int, default=1, help="GRM rows decoded together")
    p.add_argument("--hbm-gbps", type=float, default=None, help="HBM bandwidth GB/s for the bound (default: by device)")
    p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--no-decode", action="store_true", help="skip the GRM decode measurement")
    p.add_argument("--decode-unfused", action="store_true",
                   help="decode with the training weight layout (separate q/k/v and gate/up weights) instead of "
                        "the evaluator's fused one (evaluation.grm.generation.prepare_for_decoding)")
    p.add_argument("--decode-prefill-rows", type=int, default=None,
                   help="GRM rows prefilled per call (default: all while that is <= 128K tokens, else 1, each "
                        "written straight into its cache row)")
    p.add_argument("--decode-attention", choices=("auto", "xla", "pallas"), default="auto",
                   help="decode-step attention as `python -m longrm_jax.evaluate --decode-attention` (auto: the "
                        "Triton kernel on one GPU)")
    p.add_argument("--decode-no-gpu-flags", action="store_true",
                   help="decode without the GPU decode XLA flags (by default its subprocess gets them, as "
                        "`python -m longrm_jax.evaluate` does for GRM runs; DisRM parts never do)")
    p.add_argument("--no-shared", action="store_true", help="skip the --share-prompt DisRM measurement")
    p.add_argument("--benchmark", action="store_true",
                   help="whole synthetic Long-RewardBench end to end through `python -m longrm_jax.evaluate`, "
                        "against the PyTorch peer (scripts/bench_benchmark.py; options below)")
    bench_benchmark.add_arguments(p)
    p.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.benchmark:
        return bench_benchmark.main(args, argv)
    if args.smoke:
        args.preset = "tiny_qwen3" if args.preset == "qwen3_8b" else args.preset
    if args.lengths is None:
        args.lengths = [256, 512] if args.smoke else [32_768, 131_072]
    args.decode_context = args.decode_context or (256 if args.smoke else 32_768)
    args.decode_steps = args.decode_steps or (16 if args.smoke else 256)

    if args.part:  # child process: one measurement
        result = PARTS[args.part](args)
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0

    disrm, shared = {}, {}
    for seq in args.lengths:
        ours = run_part(args, "disrm-jax", seq)
        peer = None if args.no_peer else run_part(args, "disrm-torch", seq)
        disrm[seq] = (ours, peer)
        if not args.no_shared:
            shared[seq] = run_part(args, "disrm-shared-jax", seq)
    decode = None if args.no_decode else run_part(args, "decode-jax")
    device, details = report_device(disrm, decode), report_details(args)
    tables = build_report(args, disrm, decode, shared)
    print(f"{device}: {details}\n\n" + "\n".join(tables))
    path = _bench.record_path(args)
    if path:
        _bench.append_section(path, "evaluation", command=_bench.command_line(argv), device=device, details=details,
                              table=tables)
    ok = all(o for o, _ in disrm.values()) and (args.no_decode or decode is not None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
