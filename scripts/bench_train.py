"""Benchmark training steps (SimPO and Bradley-Terry) of the JAX trainer against the PyTorch peer.

    python scripts/bench_train.py                 # GPU: Qwen3-8B and Llama-3.1-8B shapes, random weights
    python scripts/bench_train.py --smoke         # tiny shapes on the CPU (checks the script runs)

For each model shape, stage and pair length L (chosen and rejected of about L tokens each; `--layout rows`, the
default: one sequence per row, attention without segment ids; `packed`: rows of `--row-tokens` (default 2 L)
holding whole groups, with segment ids) it times training steps with random weights:
- JAX: the product itself. Each configuration runs `python -m longrm_jax.train` with the shipped config of
  its stage (configs/qwen3_8b_grm_simpo.yaml, configs/llama31_8b_disrm_bt.yaml, configs/qwen3_8b_grm_sft.yaml)
  and only init / data / length / mesh overrides (plus `--set` ones given here): the real data pipeline over
  synthetic long pairs (contexts of L - 64 tokens, so each sequence nearly fills its L-token slot), the
  trainer's own step programs, and the tokens/s, MFU and peak memory it writes to metrics.jsonl (median over
  the steps after `--warmup`). On each device count of `--devices`: n > 1 devices as fsdp x seq (ring
  attention over all n), when visible. `--full-params` trains every weight where the config uses LoRA.
- the PyTorch peer in the same run (each configuration in its own process): HF transformers, SDPA, gradient checkpointing, AdamW, bf16 weights, the pair
  as a batch of 2 sequences. It trains what the JAX run trains: where the stage's config uses LoRA (and
  `--full-params` is not given) the peer wraps the model in peft LoRA of the same rank, alpha, targets and fully
  trained modules; without peft installed it trains every weight and its row says so ("not the same work").
  Both sides count FLOPs by the same rule (docs/flops.md; LoRA: no weight gradients for the frozen base).
It prints tokens/s, MFU (docs/flops.md: FLOPs = 6 N_matmul + 6 L H d S per token, 4 N for LoRA's frozen weights, 989 TFLOP/s peak per
H100/H200) and peak memory, as a table, and appends the table to docs/benchmarks.md (`--no-record`: print only;
with --smoke only to a file named by --benchmarks-md). `--json` keeps every figure, `--plot` draws tokens/s and MFU against pair length, ours
against the peer, and the last lines name the longest pair each device count trained (list longer lengths
in `--lengths` to search: a length that does not fit shows as out of memory and stops that device count).

`--search` finds the longest pair per setup instead of a fixed grid: one device on-device (`--search-remats`'
first policy, default `full`), one device offloading saved activations to pinned host memory (the others,
default `offload_layer_inputs`), and n > 1 devices of `--devices` with ring attention (the first policy). From
`--search-start` it doubles the pair length while a run trains, then bisects between the longest that trained
and the shortest that did not, to `--search-step` tokens. A length the trainer's memory plan refuses costs one
compile (the CLI stops before loading weights); the table shows the plan's predicted device and pinned-host
GiB beside the measured device peak and the process's peak resident host memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np

import _bench

MODELS = {"qwen3_8b": "Qwen3-8B", "llama31_8b": "Llama-3.1-8B"}
TINY = {"qwen3_8b": "tiny_qwen3", "llama31_8b": "tiny_llama"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _bench.add_common_flags(p, iters=None, warmup=None, smoke_help="tiny shapes, CPU, 2 timed steps")
    p.add_argument("--models", default="qwen3_8b,llama31_8b", help="comma list of " + ", ".join(MODELS))
    p.add_argument("--stages", default="simpo,bt", help="comma list of simpo, bt, sft")
    p.add_argument("--lengths", default="16384,32768", help="tokens per response sample L (row = 2 L)")
    p.add_argument("--devices", default="1,2",
                   help="JAX device counts to run (n > 1: fsdp x seq, the sequence ring over all n)")
    p.add_argument("--steps", type=int, default=3, help="timed steps (after the compile step and --warmup)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after the compile step (a fresh JAX "
                   "process runs its first steps after compiling up to 1.6x slower: H200, 2 x 8K tokens)")
    p.add_argument("--param-dtype", default="bfloat16", help="JAX master weights / AdamW state dtype "
                   "(bfloat16 matches the peer's memory; float32 for fp32 masters)")
    p.add_argument("--remat", default="auto", help="model.remat of the training CLI (auto: the fastest that fits)")
    p.add_argument("--layout", default="rows", choices=("rows", "packed"), help="data.layout of the JAX step")
    p.add_argument("--json", default=None, help="append one JSON object per configuration to this file")
    p.add_argument("--plot", default=None, help="PNG: tokens/s and MFU against pair length, ours vs the peer")
    p.add_argument("--row-tokens", type=int, default=None, help="packed layout: tokens per row (default 2 L: one "
                   "pair; e.g. 128000 holds several groups of L-token sequences)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro steps per optimizer step (grad_accum)")
    p.add_argument("--full-params", action="store_true", help="lora.rank=0 where the stage's config uses LoRA")
    p.add_argument("--set", action="append", default=[], help="extra `--set key=value` for the training CLI")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--search", action="store_true", help="search the longest pair per setup (see above)")
    p.add_argument("--search-remats", default="full,offload_layer_inputs", help="model.remat of the setups: "
                   "the first on device (1 and n devices), the others on 1 device (offloading)")
    p.add_argument("--search-start", type=int, default=32768, help="first pair length L of the search")
    p.add_argument("--search-step", type=int, default=16384, help="bisection resolution (tokens of L)")
    p.add_argument("--search-max", type=int, default=524288, help="longest L tried")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one config, print JSON
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ batches


def pair_batch(length: int, vocab: int, seed: int = 0) -> dict:
    """The peer's input: one chosen and one rejected sample of ``length`` random tokens (the last 10% of each
    response)."""
    rng = np.random.default_rng(seed)
    t = 2 * length
    ids = rng.integers(10, vocab - 10, (1, t)).astype(np.int32)
    mask = np.zeros((1, t), np.int32)
    resp = max(1, length // 10)
    mask[0, length - resp:length] = 1
    mask[0, t - resp:] = 1
    return {"input_ids": ids, "loss_mask": mask}


# ------------------------------------------------------------------------------------------------ JAX

STAGE_CONFIGS = {"simpo": "configs/qwen3_8b_grm_simpo.yaml", "bt": "configs/llama31_8b_disrm_bt.yaml",
                 "sft": "configs/qwen3_8b_grm_sft.yaml"}
CONTEXT_MARGIN = 64  # chat template + judgment tokens around a synthetic context (tiny tokenizer: 57-58)


def train_command(model: str, stage: str, length: int, n_devices: int, args, out_dir: str,
                  remat: str | None = None) -> list[str]:
    """The `python -m longrm_jax.train` command line of one configuration (``remat`` default: ``--remat``)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = args.layout == "rows" and stage != "sft"
    row_tokens = length if rows else (args.row_tokens or (length if stage == "sft" else 2 * length))
    per_row = max(1, row_tokens // length) if not rows else 1
    sets = [
        "model.init=null", f"model.preset={TINY[model] if args.smoke else model}", f"model.remat={remat or args.remat}",
        f"model.param_dtype={args.param_dtype}", f"model.compute_dtype={'float32' if args.smoke else 'bfloat16'}",
        "data.source=synthetic", "data.eval_source=null", "data.tokenizer=null", f"data.layout={args.layout if stage != 'sft' else 'packed'}",
        f"data.seq_len={row_tokens}", f"data.batch_rows={2 if rows else 1}", f"grad_accum={args.grad_accum}",
        f"data.num_train={max(4, 2 * per_row) * (args.warmup + args.steps + 1) * args.grad_accum}",
        f"data.synthetic={{lengths: [{max(length - CONTEXT_MARGIN, 8)}]}}",
        f"steps={args.warmup + args.steps + 1}", "log_every=1", "eval_before=false", "eval_after=false",
        "checkpoint.every=0", "checkpoint.at_end=false", "tensorboard=false", "progress=false",
        "mesh.data=1", "mesh.fsdp=1", f"mesh.seq={n_devices}", "mesh.param_axes=[fsdp, seq]",
        f"output_dir={out_dir}",
    ]
    if args.full_params:
        sets.append("lora.rank=0")
    sets += args.set
    cmd = [sys.executable, "-m", "longrm_jax.train", "--config", os.path.join(root, STAGE_CONFIGS[stage])]
    for item in sets:
        cmd += ["--set", item]
    return cmd


def run_measured(cmd: list[str], env: dict, cwd: str) -> tuple[subprocess.CompletedProcess, float | None]:
    """Run ``cmd`` to completion; (its result, its peak resident memory in GiB). The peak comes from the
    child's own rusage (wait4), so it is this run's alone: pinned host buffers of offloaded activations count
    in it once touched."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=cwd)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            proc.kill()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
    return done, (usage.ru_maxrss * 1024 / 2**30 if usage.ru_maxrss else None)


def bench_jax(model: str, stage: str, length: int, n_devices: int, args, remat: str | None = None) -> dict:
    """One configuration through the training CLI; figures from its metrics.jsonl and memory_plan.json."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_train_") as out_dir:
        cmd = train_command(model, stage, length, n_devices, args, out_dir, remat)
        env = dict(os.environ)
        # A training process owns its GPU: let XLA's pool take 95% of it (JAX's default is 75%), as the peer may.
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
        t0 = time.perf_counter()
        proc, host_rss = run_measured(cmd, env, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        wall = time.perf_counter() - t0
        metrics = []
        path = os.path.join(out_dir, "metrics.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                metrics = [json.loads(line) for line in f if line.strip()]
        plan = {}
        if os.path.exists(os.path.join(out_dir, "memory_plan.json")):
            with open(os.path.join(out_dir, "memory_plan.json"), encoding="utf-8") as f:
                plan = json.load(f)
    steps = [m for m in metrics if m.get("split") == "train"][1 + args.warmup:]
    if proc.returncode != 0 or not steps:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        print(f"$ {' '.join(cmd)}\n" + "\n".join(err[-30:]), file=sys.stderr)
        reason = next((l for l in reversed(err) if "Error" in l or "error" in l), err[-1] if err else "no output")
        text = proc.stderr or ""
        refused = re.search(r"does not fit the (device|host's pinned memory): predicted ([0-9.]+) GiB", text)
        out = {"skipped": reason[:120], "command": " ".join(cmd), "host_rss_gib": host_rss, "wall_s": wall}
        if refused:  # the memory plan stopped it before loading weights: its prediction is the figure
            out["skipped"] = f"plan: does not fit the {refused.group(1)} ({refused.group(2)} GiB predicted)"
            out["predicted_gib" if refused.group(1) == "device" else "predicted_host_gib"] = float(refused.group(2))
        return out
    med = lambda key: float(np.median([m[key] for m in steps])) if steps[0].get(key) is not None else None
    tokens_per_s = med("tokens_per_s")
    return {"tokens_per_s": tokens_per_s, "mfu": med("mfu"), "peak_gib": max(m["peak_gib"] or 0 for m in steps) or None,
            "predicted_gib": plan.get("predicted_peak_gib"), "remat_used": plan.get("remat"),
            "predicted_host_gib": plan.get("predicted_host_gib"), "host_rss_gib": host_rss,
            "step_s": med("step_s"), "step_times": [m["step_s"] for m in steps], "loss": steps[-1]["loss"],
            "device": plan.get("device"),
            "wall_s": wall, "command": " ".join(cmd)}


def bench_torch(model: str, stage: str, length: int, args) -> dict:
    import torch
    import transformers

    from longrm_jax.models.config import to_hf_config
    from longrm_jax.training.config import load_config
    from longrm_jax.training.model_setup import preset_config
    from longrm_jax.training.telemetry import step_flops

    preset = TINY[model] if args.smoke else model
    cfg = load_config(None, [f"model.preset={preset}"] + (["model.overrides.vocab_size=1000"] if args.smoke else []))
    head = "classifier" if stage == "bt" else "causal_lm"
    mcfg = preset_config(cfg).replace(head=head)
    if mcfg.pad_token_id is None:  # tiny presets take their ids from a tokenizer; HF pools at the last non-pad
        mcfg = mcfg.replace(pad_token_id=0)
    stage_cfg = load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         STAGE_CONFIGS[stage]), [])
    lora_cfg = None if args.full_params or stage_cfg.lora.rank <= 0 else stage_cfg.lora
    hf_cfg = transformers.AutoConfig.for_model(**to_hf_config(mcfg))
    hf_cfg._attn_implementation = "sdpa"
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cls = transformers.AutoModelForSequenceClassification if head == "classifier" else transformers.AutoModelForCausalLM
    with torch.device(device):
        net = cls.from_config(hf_cfg, dtype=dtype)
    net.gradient_checkpointing_enable()
    trains, lora_flops = "all weights", None
    if lora_cfg is not None:
        net, trains, lora_flops = _peft_lora(net, lora_cfg)
    net.train()
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-6, betas=(0.9, 0.95),
                            weight_decay=0.0)
    host = pair_batch(length, mcfg.vocab_size)
    ids = torch.tensor(host["input_ids"].reshape(2, length), dtype=torch.long, device=device)
    mask = torch.tensor(host["loss_mask"].reshape(2, length), device=device)

    def step():
        if head == "classifier":
            r = net(input_ids=ids).logits[:, 0].float()
            loss = -torch.nn.functional.logsigmoid(r[0] - r[1])
        else:
            logits = net(input_ids=ids).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
            m = mask[:, 1:].float()
            pi = (lp * m).sum(-1) / m.sum(-1)
            loss = -torch.nn.functional.logsigmoid(2.5 * (pi[0] - pi[1]) - 0.5)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(1 + args.warmup):  # as the JAX runs: a first step, then --warmup untimed ones
        step()
    sync()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()  # float(loss) synchronises
        sync()
        times.append(time.perf_counter() - t0)
    dt = float(np.median(times))
    flops = step_flops(mcfg, head, np.ones((2, length), np.int32), lora=lora_flops)
    peak = 989e12 if device == "cuda" and any(k in torch.cuda.get_device_name() for k in ("H100", "H200")) else None
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    del net, opt
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"tokens_per_s": 2 * length / dt, "step_s": dt, "mfu": flops / dt / peak if peak else None,
            "peak_gib": peak_mem, "loss": loss, "step_times": times, "trains": trains,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}


def _peft_lora(net, lora_cfg):
    """(the peer wrapped in peft LoRA as the JAX config trains it, its label, its LoraFlops); without peft the
    unwrapped peer, a label saying it trains every weight, and None (full-training FLOPs)."""
    from longrm_jax.training.lora import ALL_LINEAR
    from longrm_jax.training.telemetry import LoraFlops

    try:
        import peft
    except ImportError:
        return net, "all weights: peft not installed, not the same work as the JAX LoRA run", None
    targets = sorted({n for t in lora_cfg.targets for n in (ALL_LINEAR if t == "all-linear" else (t,))})
    # task_type None: the score head is only what targets / modules_to_save make it (as the JAX config says).
    config = peft.LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=0.0, target_modules=targets,
                             modules_to_save=list(lora_cfg.train_modules) or None)
    net = peft.get_peft_model(net, config)
    adapters = sum(p.numel() for n, p in net.named_parameters() if p.requires_grad and "lora_" in n)
    label = f"LoRA r={lora_cfg.rank} (peft), as the JAX run"
    return net, label, LoraFlops(adapters, head_trained=bool(lora_cfg.train_modules))


# ------------------------------------------------------------------------------------------------ main


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def run_peer(spec: str, args) -> dict:
    """Child process: the PyTorch peer of one configuration ``model,stage,length``."""
    model, stage, length = spec.split(",")
    try:
        return bench_torch(model, stage, int(length), args)
    except Exception as e:  # noqa: BLE001 - an OOM in one config must not stop the table
        traceback.print_exc()
        return {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"}


def _run_peer_child(passthrough: list[str], spec: str) -> dict:
    # A fresh process per configuration: peak-memory counters never reset and the GPU must be free for the next.
    cmd = [sys.executable, os.path.abspath(__file__), *passthrough, "--one", spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if lines:
        return json.loads(lines[-1][len("RESULT "):])
    sys.stderr.write(proc.stderr[-4000:])
    return {"skipped": f"child exited {proc.returncode} (killed / out of memory?)"}


def search_longest(trains, start: int, step: int, maximum: int) -> list[tuple[int, dict]]:
    """Probes of a longest-pair search: ``trains(L) -> result`` (trained when it has ``tokens_per_s``). Doubles
    L from ``start`` while it trains (up to ``maximum``), then bisects between the longest that trained and
    the shortest that did not, on multiples of ``step``. Returns [(L, result)] in probe order."""
    probes: list[tuple[int, dict]] = []

    def probe(length):
        res = trains(length)
        probes.append((length, res))
        return "tokens_per_s" in res

    good, bad, length = 0, None, start
    while bad is None and length <= maximum:
        if probe(length):
            good, length = length, 2 * length
        else:
            bad = length
    if bad is None:
        return probes
    while bad - good > step:
        mid = (good + bad) // 2 // step * step
        if mid <= good:
            break
        if probe(mid):
            good = mid
        else:
            bad = mid
    return probes


def search_setups(args) -> list[tuple[str, int, str]]:
    """(run name, devices, model.remat) of each setup ``--search`` measures."""
    remats = args.search_remats.split(",")
    setups = []
    for n in (int(d) for d in args.devices.split(",")):
        if n == 1:
            setups.append((f"jax 1dev {remats[0]}", 1, remats[0]))
            setups += [(f"jax 1dev {r}", 1, r) for r in remats[1:]]
        else:
            setups.append((f"jax {n}dev fsdp x seq {remats[0]}", n, remats[0]))
    return setups


def longest_pairs(results: list[dict]) -> list[str]:
    """One line per (model, stage, run): the longest pair length that trained."""
    best: dict[tuple, int] = {}
    for r in results:
        key = (r["model"], r["stage"], r["run"])
        if "tokens_per_s" in r:
            best[key] = max(best.get(key, 0), r["length"])
    return [f"Longest pair trained: {m} {s} {run}: 2 x {n:,} tokens" for (m, s, run), n in sorted(best.items())]


def plot_scaling(results: list[dict], path: str) -> None:
    """tokens/s and MFU against pair length, one line per (model, stage, run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series: dict[tuple, list] = {}
    for r in results:
        if "tokens_per_s" in r:
            series.setdefault((r["model"], r["stage"], r["run"]), []).append(r)
    for (model, stage, run), pts in sorted(series.items()):
        pts.sort(key=lambda r: r["length"])
        x = [2 * r["length"] / 1024 for r in pts]
        style = "--" if run.startswith("pytorch") else "-"
        label = f"{model} {stage} {run}"
        axes[0].plot(x, [r["tokens_per_s"] for r in pts], style, marker="o", label=label)
        axes[1].plot(x, [100 * (r["mfu"] or 0) for r in pts], style, marker="o", label=label)
    for ax, ylabel in zip(axes, ("tokens / s", "MFU %")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per step (chosen + rejected), K")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle("Training step, longrm_jax vs PyTorch peer (transformers + SDPA)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            count = max([2] + [int(d) for d in args.devices.split(",")])
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                       f" --xla_force_host_platform_device_count={count}")
    if args.one:
        print("RESULT " + json.dumps(run_peer(args.one, args)), flush=True)
        return 0
    lengths = [128] if args.smoke else [int(x) for x in args.lengths.split(",")]
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--one")]
    rows = []
    for model in args.models.split(",") if args.search else ():
        for stage in args.stages.split(","):
            for name, n, remat in search_setups(args):
                def trains(length, model=model, stage=stage, name=name, n=n, remat=remat):
                    res = bench_jax(model, stage, length, n, args, remat)
                    res |= {"model": MODELS[model], "stage": stage, "length": length, "run": name, "devices": n,
                            "layout": args.layout, "remat": remat}
                    rows.append((MODELS[model], stage, f"2x{length}", name, res))
                    print(rows[-1], flush=True)
                    if args.json:
                        with open(args.json, "a", encoding="utf-8") as f:
                            f.write(json.dumps(res) + "\n")
                    return res

                search_longest(trains, args.search_start, args.search_step, args.search_max)
    for model in args.models.split(",") if not args.search else ():
        for stage in args.stages.split(","):
            failed: set[int] = set()  # device counts (0 = peer) that already failed at a shorter length
            for length in lengths:
                runs = [(f"jax {n}dev" + (" fsdp x seq" if n > 1 else ""), n)
                        for n in (int(d) for d in args.devices.split(","))]
                if not args.no_torch:
                    runs.append(("pytorch 1dev", 0))
                for name, n in runs:
                    if n in failed:
                        res = {"skipped": "a shorter pair already failed"}
                    else:
                        res = (bench_jax(model, stage, length, n, args) if n > 0
                               else _run_peer_child(passthrough, f"{model},{stage},{length}"))
                        if "skipped" in res and "devices needed" not in res["skipped"]:
                            failed.add(n)
                    res |= {"model": MODELS[model], "stage": stage, "length": length, "run": name,
                            "devices": n, "layout": None if n == 0 else args.layout,
                            "remat": None if n == 0 else args.remat}
                    rows.append((MODELS[model], stage, f"2x{length}", name, res))
                    print(rows[-1], flush=True)
                    if args.json:
                        with open(args.json, "a", encoding="utf-8") as f:
                            f.write(json.dumps(res) + "\n")
    header = ("| model | stage | pair | run | tokens/s | step s | MFU | peak GiB | predicted GiB | host GiB predicted "
              "pinned / peak RSS | remat / note |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [header]
    for model, stage, pair, name, r in rows:
        lines.append(f"| {model}{' (tiny)' if args.smoke else ''} | {stage} | {pair} | {name} | "
                     f"{_fmt(r.get('tokens_per_s'), '.0f')} | {_fmt(r.get('step_s'), '.3f')} | "
                     f"{_fmt(None if r.get('mfu') is None else 100 * r['mfu'], '.1f')} | "
                     f"{_fmt(r.get('peak_gib'), '.1f')} | {_fmt(r.get('predicted_gib'), '.1f')} | "
                     f"{_fmt(r.get('predicted_host_gib'), '.1f')} / {_fmt(r.get('host_rss_gib'), '.1f')} | "
                     f"{r.get('skipped', '') or r.get('remat_used') or r.get('trains') or ''} |")
    table = "\n".join(lines + [""] + longest_pairs([r for *_, r in rows]))
    print(table)
    if args.plot:
        plot_scaling([r for *_, r in rows], args.plot)
    path = _bench.record_path(args)
    if path:
        dev = next((r["device"] for *_, r in rows if r.get("device")), "unknown device")
        _bench.append_section(
            path, "training steps", command=_bench.command_line(passthrough), device=dev,
            details=f"layout {args.layout}, param dtype {args.param_dtype}, "
                    f"{'longest-pair search' if args.search else 'remat ' + args.remat}. JAX rows are "
                    "`python -m longrm_jax.train` runs (metrics.jsonl medians); commands in --json.",
            table=table.splitlines())
    return 0


if __name__ == "__main__":
    sys.exit(main())
