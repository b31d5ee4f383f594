"""Whole-benchmark throughput: a synthetic Long-RewardBench evaluated end to end, ours vs the PyTorch peer.

    python scripts/bench_eval.py --benchmark                  # GPU: Qwen3-8B GRM + Llama-3.1-8B DisRM shapes
    python scripts/bench_eval.py --benchmark --smoke          # tiny models on the CPU (checks the harness)

What runs, each in its own process (one framework's memory never limits the other's):

* Data: ``longrm_jax.data.synthetic.write_long_rewardbench`` for all seven tasks, Pairwise and Best-of-N (a
  third of the rows, 3-4 candidates: cycling 2, 3, 4 over the Best-of-N rows as the generator does), context
  lengths 4K, 8K, ..., 128K tokens in equal shares (the benchmark's buckets; scaled by ``--length-scale``),
  ``--samples`` rows in all (default 1,900 x ``--scale``), tasks in equal shares. Equal shares are an
  assumption: the per-bucket counts of the real benchmark are not stored here.
* Models: random weights of the ``--grm-preset`` / ``--disrm-preset`` shapes written as HF checkpoints
  (``save_pretrained``) with the bundled tiny tokenizer, so the load phase reads real safetensors.
* Ours: ``python -m longrm_jax.evaluate`` (GRM: continuous batching, slots from device memory unless
  ``--batch-size``; DisRM: ``--is-disrm``, ``--share-prompt`` unless ``--no-share-prompt``). GRM runs with
  ``--simulate-judgement-lengths``: a random model never writes EOS, so each judgement is cut at a per-prompt
  length drawn like real judgements (``longrm_jax.evaluation.grm.simulated_lengths``: a quarter run to the budget,
  the rest log-uniform from 128 tokens). Phases (load, compile, prefill, decode, aggregation) come from the
  run's ``timings.json``; wall time is the whole process, imports included.
* Peer: transformers on the same prompts (built by our encoding code, so only the model execution differs):
  GRM ``generate`` with SDPA, a static cache and greedy decoding, in static batches per length bucket of at
  most as many rows as our slot pool of that bucket had (sorted by length, left-padded), every row stopped at
  the same simulated length; DisRM the classifier one sequence per forward.

Samples per hour = samples / wall seconds of the evaluating process. Recorded like every benchmark script
(``scripts/_bench.py``: docs/benchmarks.md unless ``--no-record``; ``--smoke`` only into ``--benchmarks-md``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import _bench

ROOT = _bench.REPO_ROOT
TASKS = ("LongQA", "Summ", "Safety", "ICL", "Cite", "Code", "Math")
BENCHMARK_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
BENCHMARK_SAMPLES = 1900
RESULT_TAG = "BENCH_RESULT "


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--benchmark (whole synthetic Long-RewardBench, end to end)")
    g.add_argument("--scale", type=float, default=None,
                   help="fraction of the benchmark's 1,900 samples (default 0.05 on a GPU, smoke: 14 samples)")
    g.add_argument("--samples", type=int, default=None, help="samples in all (overrides --scale)")
    g.add_argument("--length-scale", type=float, default=None,
                   help="multiply the 4K..128K context lengths (default 1; smoke 1/256)")
    g.add_argument("--max-new-tokens", type=int, default=None, help="GRM budget (default 2048; smoke 16)")
    g.add_argument("--grm-preset", default="qwen3_8b", help="GRM shapes (PRESETS)")
    g.add_argument("--disrm-preset", default="llama31_8b", help="DisRM shapes (PRESETS)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="GRM slots, both sides (default: ours from device memory; the peer gets the same count)")
    g.add_argument("--kinds", nargs="+", default=["grm", "disrm"], choices=("grm", "disrm"))
    g.add_argument("--no-share-prompt", action="store_true", help="DisRM: score every sequence whole")
    g.add_argument("--workdir", default=None, help="where data, checkpoints and outputs go (default: a temp dir)")
    g.add_argument("--peer-part", choices=("grm", "disrm"), help=argparse.SUPPRESS)
    g.add_argument("--peer-slots", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--peer-model", help=argparse.SUPPRESS)
    g.add_argument("--peer-slot-plan", help=argparse.SUPPRESS)
    g.add_argument("--peer-data", help=argparse.SUPPRESS)
    # The peer on the length buckets from --peer-min-length up to --peer-max-length only (issue 31's
    # extrapolation: a bucket measured in another call is left out, its time added from there; every skipped
    # bucket is printed).
    g.add_argument("--peer-max-length", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--peer-min-length", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--checkpoint-part", nargs=3, metavar=("PRESET", "HEAD", "PATH"), help=argparse.SUPPRESS)


def resolve(args) -> None:
    if args.samples is None:
        args.samples = 14 if args.smoke and args.scale is None else round(BENCHMARK_SAMPLES * (args.scale or 0.05))
    args.length_scale = args.length_scale or (1 / 256 if args.smoke else 1.0)
    args.max_new_tokens = args.max_new_tokens or (16 if args.smoke else 2048)


# ---------------------------------------------------------------------------------------------- inputs
def write_data(args, out: str) -> list[int]:
    from longrm_jax.data.synthetic import write_long_rewardbench

    lengths = [max(16, int(n * args.length_scale)) for n in BENCHMARK_LENGTHS]
    per_task = max(1, round(args.samples / len(TASKS)))
    write_long_rewardbench(out, per_task=per_task, seed=0, lengths=lengths, tasks=TASKS, bon_fraction=1 / 3)
    return lengths


def write_checkpoint(args, path: str, head: str) -> None:
    """Random weights of the preset (smoke: a tiny model) saved as an HF checkpoint with the tiny tokenizer."""
    from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR

    if args.smoke:
        _bench.write_random_hf("tiny_qwen3" if head == "causal_lm" else "tiny_llama", head, path)
    else:
        # In a child process (``checkpoint_part``): this one must not hold device memory while the measured
        # processes run (the first try, in-process, ran both sides out of memory).
        preset = args.grm_preset if head == "causal_lm" else args.disrm_preset
        cmd = [sys.executable, os.path.abspath(os.path.join(ROOT, "scripts", "bench_eval.py")), "--benchmark",
               "--checkpoint-part", preset, head, path]
        subprocess.run(cmd, check=True, env=_child_env(), cwd=ROOT)
    for item in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(TINY_TOKENIZER_DIR, item), os.path.join(path, item))


def checkpoint_part(preset: str, head: str, path: str) -> None:
    """Random weights of ``preset`` initialised on the accelerator and written by our HF export: an 8B model in
    seconds, where transformers' CPU initialisation took ~5 minutes of a 10-minute device command;
    transformers loads the result like any checkpoint (tests/test_hf_export.py)."""
    import jax
    from flax import nnx

    from longrm_jax.hf.save import save_pretrained
    from longrm_jax.models import ModelConfig, build_model
    from longrm_jax.training.model_setup import PRESETS

    fields = {"vocab_size": 1024, **PRESETS[preset]}  # tiny presets take their vocabulary from a tokenizer
    cfg = ModelConfig(**fields).replace(head=head, num_labels=1, pad_token_id=0, eos_token_id=2,
                                        dtype="bfloat16", param_dtype="bfloat16")
    model = jax.jit(lambda: build_model(cfg, rngs=nnx.Rngs(0)))()
    save_pretrained(model, path, progress=False)


def _child_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))


# ------------------------------------------------------------------------------------------------ ours
def run_ours(args, kind: str, model: str, data: str, save: str) -> dict:
    cmd = [sys.executable, "-m", "longrm_jax.evaluate", "--model-path", model, "--data-path", data,
           "--save-path", save, "--overwrite", "--no-progress", "--dtype", "float32" if args.smoke else "bfloat16"]
    if kind == "grm":
        cmd += ["--max-new-tokens", str(args.max_new_tokens), "--simulate-judgement-lengths",
                "--allow-no-verdicts"]  # random weights: a speed race, no verdict expected
        if args.batch_size:
            cmd += ["--batch-size", str(args.batch_size)]
    else:
        cmd += ["--is-disrm"] + ([] if args.no_share_prompt else ["--share-prompt"])
    return _timed_process(cmd, lambda: json.load(open(os.path.join(save, "timings.json"))),
                          log_path=save.rstrip(os.sep) + ".log")


def _timed_process(cmd, read_result, log_path: str | None = None) -> dict:
    env = _child_env()
    begin = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - begin
    if log_path:  # the whole stderr (slot plan, estimate, any error), beside the results
        with open(log_path, "w", encoding="utf-8") as f:
            f.write(proc.stderr)
    if proc.returncode != 0:
        print(f"[bench_benchmark] failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}",
              file=sys.stderr)
        return {}
    return dict(read_result(), wall_s=wall)


# ------------------------------------------------------------------------------------------------ peer
def peer_inputs(args, kind: str, model: str, data: str):
    """(samples, sequences): the prompts (GRM) or scored sequences (DisRM) our evaluator builds."""
    from longrm_jax.evaluation.encoding import disrm_sequences, grm_prompt_ids, load_chat_tokenizers
    from longrm_jax.evaluation.judging import judged_orders
    from longrm_jax.evaluation.runner import EvalConfig, load_samples

    cfg = EvalConfig(model_path=model, data_path=data, is_disrm=kind == "disrm")
    samples = load_samples(cfg)
    disrm_tok, grm_tok = load_chat_tokenizers(model)
    if kind == "disrm":
        return samples, [ids for s in samples for ids, _ in disrm_sequences(s, disrm_tok, cfg.max_length)], disrm_tok
    prompts = [grm_prompt_ids(s, grm_tok, order, cfg.max_length)[0]
               for s in samples for order in judged_orders(s, False)]
    return samples, prompts, grm_tok


def peer_part(args) -> dict:
    """In a fresh process: the transformers peer on ``args.peer_part``; prints its result dict."""
    import numpy as np
    import torch
    import transformers

    from longrm_jax.evaluation.batching import plan_batches
    from longrm_jax.evaluation.encoding import stop_token_ids
    from longrm_jax.evaluation.grm.simulated_lengths import judgement_lengths

    kind, model_dir, data = args.peer_part, args.peer_model, args.peer_data
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    begin = time.perf_counter()
    samples, seqs, tokenizer = peer_inputs(args, kind, model_dir, data)
    prepare = time.perf_counter() - begin
    begin = time.perf_counter()
    auto = transformers.AutoModelForCausalLM if kind == "grm" else transformers.AutoModelForSequenceClassification
    model = auto.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="sdpa").to(device).eval()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    load = time.perf_counter() - begin
    begin = time.perf_counter()
    generated = splits = 0
    with torch.inference_mode():
        if kind == "disrm":
            for ids in seqs:
                model(torch.tensor(ids[None].astype(np.int64), device=device)).logits.float().cpu()
        else:
            budgets = judgement_lengths(seqs, args.max_new_tokens)
            stops = stop_token_ids(model_dir, tokenizer)
            plan = json.loads(args.peer_slot_plan or "{}")  # bucket -> rows, as our slot pools had
            batches = []
            for bucket_batch in plan_batches([len(s) for s in seqs], max_rows=len(seqs)):  # one per bucket
                if (args.peer_max_length and bucket_batch.length > args.peer_max_length) or \
                        (args.peer_min_length and bucket_batch.length < args.peer_min_length):
                    print(f"[peer] bucket {bucket_batch.length}: {len(bucket_batch.items)} prompts skipped "
                          f"(buckets {args.peer_min_length or 0}..{args.peer_max_length or 'any'} tokens)",
                          file=sys.stderr, flush=True)
                    continue
                rows = plan.get(str(bucket_batch.length), args.peer_slots or 4)
                batches += [bucket_batch.items[i:i + rows] for i in range(0, len(bucket_batch.items), rows)]
            # A batch of our slot plan that transformers cannot hold (SDPA with a padding mask materialises
            # attention weights: 11 rows of 16K tokens ran an H100 out of memory) is split in halves and run
            # again; the split count is reported. The out-of-memory attempt's time stays in the run time.
            pending, number = list(batches), 0
            while pending:
                items = pending.pop(0)
                number += 1
                batch_begin = time.perf_counter()
                rows = [seqs[i] for i in items]
                width = max(len(r) for r in rows)
                ids = np.zeros((len(rows), width), np.int64)
                mask = np.zeros_like(ids)
                for r, row in enumerate(rows):  # left padding, as HF generation expects
                    ids[r, width - len(row):], mask[r, width - len(row):] = row, 1
                limits = torch.tensor([budgets[i] for i in items], device=device)

                def at_budget(input_ids, scores, limits=limits, width=width, **_):
                    return (input_ids.shape[1] - width) >= limits

                try:
                    out = model.generate(torch.tensor(ids, device=device),
                                         attention_mask=torch.tensor(mask, device=device), do_sample=False,
                                         max_new_tokens=int(limits.max()), eos_token_id=stops, pad_token_id=0,
                                         cache_implementation="static",
                                         stopping_criteria=transformers.StoppingCriteriaList([at_budget]))
                except torch.OutOfMemoryError:
                    if len(items) == 1:
                        raise
                    torch.cuda.empty_cache()
                    half = (len(items) + 1) // 2
                    pending[:0] = [items[:half], items[half:]]
                    splits += 1
                    print(f"[peer] batch {number}: {len(rows)} rows of <= {width} tokens ran out of memory; "
                          f"split into {half} + {len(items) - half}", file=sys.stderr, flush=True)
                    continue
                new = out[:, width:].cpu().numpy()
                for r in range(len(rows)):  # tokens up to the row's first stop or budget
                    hits = [t for t, tok in enumerate(new[r].tolist()) if tok in stops]
                    generated += min(hits[0] + 1 if hits else new.shape[1], budgets[items[r]])
                sync()
                # Per batch, so a run cut short by a time limit still shows each finished bucket's time.
                print(f"[peer] batch {number} ({len(pending)} waiting): {len(rows)} rows of <= {width} tokens, "
                      f"budget {int(limits.max())}: {time.perf_counter() - batch_begin:.1f} s (run so far "
                      f"{time.perf_counter() - begin:.1f} s, {generated} tokens)", file=sys.stderr, flush=True)
    sync()
    run = time.perf_counter() - begin
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return dict(samples=len(samples), sequences=len(seqs), prepare_s=prepare, load_s=load, run_s=run,
                oom_splits=splits,
                generated_tokens=generated, device=name, torch=torch.__version__,
                transformers=transformers.__version__)


def run_peer(args, kind: str, model: str, data: str, slots: int | None, slot_plan: dict | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(os.path.join(ROOT, "scripts", "bench_eval.py")), "--benchmark",
           "--peer-part", kind, "--peer-model", model, "--peer-data", data,
           "--max-new-tokens", str(args.max_new_tokens)] + (["--smoke"] if args.smoke else [])
    if slots:
        cmd += ["--peer-slots", str(slots)]
    if slot_plan and not args.batch_size:
        cmd += ["--peer-slot-plan", json.dumps(slot_plan)]
    env = _child_env()
    begin = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - begin
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return dict(json.loads(line[len(RESULT_TAG):]), wall_s=wall)
    print(f"[bench_benchmark] peer failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
    return {}


# ---------------------------------------------------------------------------------------------- report
def _fmt(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def build_report(args, results: dict, samples: int, lengths: list[int]) -> tuple[str, list[str]]:
    """(details line, markdown lines): one table per kind, ours vs the peer, phase seconds and samples/h."""
    details = (f"synthetic Long-RewardBench, {samples} samples (7 tasks, Pairwise + Best-of-N), context lengths "
               f"{', '.join(str(n) for n in lengths)} tokens in equal shares, random weights"
               f"{'' if args.smoke else f' ({args.grm_preset} GRM, {args.disrm_preset} DisRM)'}, GRM budget "
               f"{args.max_new_tokens} tokens with simulated judgement lengths")
    lines: list[str] = []
    for kind in args.kinds:
        ours, peer = results.get(kind, ({}, {}))
        lines += [f"{kind.upper()}:", "",
                  "| side | load s | compile s | prefill s | decode s | judging s | aggregation s | wall s | "
                  "samples/h | vs peer |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        ours_rate = samples * 3600 / ours["wall_s"] if ours else None
        peer_rate = samples * 3600 / peer["wall_s"] if peer else None
        ratio = f"{ours_rate / peer_rate:.2f}x" if ours_rate and peer_rate else "-"
        if ours:
            side = f"ours, {ours['replicas']} replicas" if ours.get("replicas") else "ours"  # one process per GPU
            lines.append(f"| {side} | {_fmt(ours.get('load_s'))} | {_fmt(ours.get('compile_s'))} | "
                         f"{_fmt(ours.get('prefill_s'))} | {_fmt(ours.get('decode_s'))} | "
                         f"{_fmt(ours.get('judging_s'))} | {_fmt(ours.get('aggregation_s'), 2)} | "
                         f"{_fmt(ours['wall_s'])} | {_fmt(ours_rate)} | {ratio} |")
        else:
            lines.append("| ours | failed | | | | | | | | |")
        if peer:
            lines.append(f"| PyTorch peer | {_fmt(peer.get('load_s'))} | - | - | - | {_fmt(peer.get('run_s'))} | - | "
                         f"{_fmt(peer['wall_s'])} | {_fmt(peer_rate)} | |")
        elif not args.no_peer:
            lines.append("| PyTorch peer | failed | | | | | | | | |")
        if kind == "grm" and ours:
            lines += ["", f"ours: {ours.get('decode_tokens', 0):,} decode tokens in {_fmt(ours.get('decode_s'))} s "
                          f"({_fmt(ours.get('decode_tokens', 0) / max(ours.get('decode_s') or 1e-9, 1e-9))} tokens/s), "
                          f"{ours.get('decode_calls', 0)} decode calls, up to {ours.get('max_slots', '?')} slots; "
                          f"generated tokens: ours {ours.get('generated_tokens', 0):,}, "
                          f"peer {peer.get('generated_tokens', '-') if peer else '-'}; slot plan (bucket: slots) "
                          f"{ours.get('slot_plan', '?')}; estimated before the run (evaluation.grm.estimate): "
                          f"{_fmt(ours.get('estimate_s'))} s of compile + prefill + decode, measured "
                          f"{_fmt((ours.get('compile_s') or 0) + (ours.get('prefill_s') or 0) + (ours.get('decode_s') or 0))} s"]
        lines.append("")
    return details, lines


def _save_side(work: str, kind: str, side: str, result: dict) -> None:
    """Each side's figures as soon as it finishes (``WORKDIR/result-KIND-SIDE.json``), printed too: a run cut
    short (a time limit) still leaves what it measured."""
    print(f"[bench_benchmark] {kind} {side}: {json.dumps(result, default=str)}", flush=True)
    with open(os.path.join(work, f"result-{kind}-{side}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


def main(args, argv=None) -> int:
    import tempfile

    if args.checkpoint_part:
        checkpoint_part(*args.checkpoint_part)
        return 0
    resolve(args)
    if args.peer_part:
        print(RESULT_TAG + json.dumps(peer_part(args)), flush=True)
        return 0
    work = args.workdir or tempfile.mkdtemp(prefix="bench_benchmark_")
    data = os.path.join(work, "data")
    lengths = write_data(args, data)
    results, samples, device = {}, 0, "cpu" if args.smoke else "?"
    for kind in args.kinds:
        model = os.path.join(work, kind)
        if not os.path.isdir(model):
            write_checkpoint(args, model, "causal_lm" if kind == "grm" else "classifier")
        print(f"[bench_benchmark] {kind}: ours", flush=True)
        ours = run_ours(args, kind, model, data, os.path.join(work, f"out-{kind}"))
        _save_side(work, kind, "ours", ours)
        device = (ours or {}).get("device", device)  # the peer's name for it below, when it runs
        peer = {}
        if not args.no_peer:
            print(f"[bench_benchmark] {kind}: PyTorch peer", flush=True)
            peer = run_peer(args, kind, model, data, args.batch_size or (ours or {}).get("max_slots"),
                            (ours or {}).get("slot_plan"))
            _save_side(work, kind, "peer", peer)
            samples = peer.get("samples", samples)
            device = peer.get("device", device)
        if not samples:
            samples = sum(1 for name in os.listdir(data) for _ in open(os.path.join(data, name)))
        results[kind] = (ours, peer)
    details, table = build_report(args, results, samples, lengths)
    print(f"{device}: {details}\n\n" + "\n".join(table))
    path = _bench.record_path(args)
    if path:
        _bench.append_section(path, "whole-benchmark evaluation", command=_bench.command_line(argv),
                              device=device, details=details, table=table)
    ok = all(o and (p or args.no_peer) for o, p in results.values())
    return 0 if ok else 1


if __name__ == "__main__":  # a module of bench_eval.py, not a script of its own: say where its options live
    print("scripts/bench_benchmark.py is the --benchmark mode of scripts/bench_eval.py; run\n"
          "  python scripts/bench_eval.py --benchmark --help", file=sys.stderr)
    sys.exit(2)
