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
  attention over all n; `--mesh fsdp`: mesh.fsdp=n, a pair per device), when visible. `--full-params` trains
  every weight where the config uses LoRA.
- the PyTorch peer in the same run (each configuration in its own process; scripts/_torch_peer.py): HF transformers,
  SDPA, gradient checkpointing, AdamW, bf16 weights, the pair as a batch of 2 sequences. It trains what the JAX
  run trains: where the stage's config uses LoRA (and
  `--full-params` is not given) the peer wraps the model in peft LoRA of the same rank, alpha, targets and fully
  trained modules; without peft installed it trains every weight and its row says so ("not the same work").
  Both sides count FLOPs by the same rule (docs/flops.md; LoRA: no weight gradients for the frozen base).
  `--peer-gpus 1,4`: also the peer on 4 GPUs, one process per GPU started here (NCCL; gloo on the CPU), FSDP2
  `fully_shard` per decoder layer and at the root (after peft), a pair per GPU; its step time is the slowest
  rank's, its peak memory the largest rank's. Its work is that of the JAX runs with `--mesh fsdp` (a pair per
  device; the default `--mesh seq` trains one pair over all devices by the ring), and the table sets the two
  against each other per GPU ("ours / peer per GPU"). On a GPU machine a JAX run of n devices sees the first n.
  On 4 GPUs: `python scripts/bench_train.py --models qwen3_8b --stages simpo --lengths 8192 --full-params
  --devices 1,4 --mesh fsdp --peer-gpus 1,4` (`bash scripts/device/run.sh fsdp2_peer_node` runs the 4-GPU pair first).
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
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np

import _bench
import _torch_peer
from _torch_peer import STAGE_CONFIGS, TINY, _peft_lora, bench_torch, pair_batch  # noqa: F401 (their old home)

MODELS = {"qwen3_8b": "Qwen3-8B", "llama31_8b": "Llama-3.1-8B"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _bench.add_common_flags(p, iters=None, warmup=None, smoke_help="tiny shapes, CPU, 2 timed steps")
    p.add_argument("--models", default="qwen3_8b,llama31_8b", help="comma list of " + ", ".join(MODELS))
    p.add_argument("--stages", default="simpo,bt", help="comma list of simpo, bt, sft")
    p.add_argument("--lengths", default="16384,32768", help="tokens per response sample L (row = 2 L)")
    p.add_argument("--devices", default="1,2",
                   help="JAX device counts to run (n > 1: --mesh says how; on a GPU machine the first n GPUs)")
    p.add_argument("--mesh", default="seq", choices=("seq", "fsdp"), help="JAX runs on n > 1 devices: seq = one "
                   "pair over all n (fsdp x seq, the sequence ring); fsdp = one pair per device (mesh.fsdp=n, "
                   "n pairs a step: the work of the peer on --peer-gpus n)")
    p.add_argument("--peer-gpus", default="1", help="GPU counts of the PyTorch peer: 1 = one process; n > 1 = "
                   "one process per GPU (started by this script), FSDP2 fully_shard per decoder layer + root, "
                   "a pair per GPU (gloo on the CPU with --smoke)")
    p.add_argument("--peer-timeout", type=float, default=None, help="seconds before a multi-GPU peer's ranks are "
                   "stopped (default: none)")
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
    p.add_argument("--peer-dump", default=None, help=argparse.SUPPRESS)  # tests: the multi-GPU peer's gradients
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ JAX

CONTEXT_MARGIN = 64  # chat template + judgment tokens around a synthetic context (tiny tokenizer: 57-58)


def train_command(model: str, stage: str, length: int, n_devices: int, args, out_dir: str,
                  remat: str | None = None) -> list[str]:
    """The `python -m longrm_jax.train` command line of one configuration (``remat`` default: ``--remat``)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = args.layout == "rows" and stage != "sft"
    row_tokens = length if rows else (args.row_tokens or (length if stage == "sft" else 2 * length))
    per_row = max(1, row_tokens // length) if not rows else 1
    fsdp = n_devices if n_devices > 1 and args.mesh == "fsdp" else 1  # a pair (row) per device
    sets = [
        "model.init=null", f"model.preset={TINY[model] if args.smoke else model}", f"model.remat={remat or args.remat}",
        f"model.param_dtype={args.param_dtype}", f"model.compute_dtype={'float32' if args.smoke else 'bfloat16'}",
        "data.source=synthetic", "data.eval_source=null", "data.tokenizer=null", f"data.layout={args.layout if stage != 'sft' else 'packed'}",
        f"data.seq_len={row_tokens}", f"data.batch_rows={(2 if rows else 1) * fsdp}", f"grad_accum={args.grad_accum}",
        f"data.num_train={max(4, 2 * per_row) * fsdp * (args.warmup + args.steps + 1) * args.grad_accum}",
        f"data.synthetic={{lengths: [{max(length - CONTEXT_MARGIN, 8)}]}}",
        f"steps={args.warmup + args.steps + 1}", "log_every=1", "eval_before=false", "eval_after=false",
        "checkpoint.every=0", "checkpoint.at_end=false", "tensorboard=false", "progress=false",
        "mesh.data=1", f"mesh.fsdp={fsdp}", f"mesh.seq={n_devices // fsdp}", "mesh.param_axes=[fsdp, seq]",
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


def visible_gpus() -> list[str]:
    """The GPUs a child would see: CUDA_VISIBLE_DEVICES, else /dev/nvidia<N>."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        return sorted((n[6:] for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit()), key=int)
    except OSError:
        return []


def bench_jax(model: str, stage: str, length: int, n_devices: int, args, remat: str | None = None) -> dict:
    """One configuration through the training CLI; figures from its metrics.jsonl and memory_plan.json."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_train_") as out_dir:
        cmd = train_command(model, stage, length, n_devices, args, out_dir, remat)
        env = dict(os.environ)
        # A training process owns its GPU: let XLA's pool take 95% of it (JAX's default is 75%), as the peer may.
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
        gpus = visible_gpus()
        if not args.smoke and len(gpus) > n_devices:  # the mesh spans every visible device: show it n of them
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[:n_devices])
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
    return {"tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s / n_devices,
            "mfu": med("mfu"), "peak_gib": max(m["peak_gib"] or 0 for m in steps) or None,
            "predicted_gib": plan.get("predicted_peak_gib"), "remat_used": plan.get("remat"),
            "predicted_host_gib": plan.get("predicted_host_gib"), "host_rss_gib": host_rss,
            "step_s": med("step_s"), "step_times": [m["step_s"] for m in steps], "loss": steps[-1]["loss"],
            "device": plan.get("device"),
            "wall_s": wall, "command": " ".join(cmd)}


# ------------------------------------------------------------------------------------------------ main


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def run_peer(spec: str, args) -> dict | None:
    """Child process: the PyTorch peer of one configuration ``model,stage,length[,gpus]`` (gpus > 1: this is one
    rank; None on ranks other than 0)."""
    model, stage, length, *gpus = spec.split(",")
    n = int(gpus[0]) if gpus else 1
    try:
        if n > 1:
            return _torch_peer.bench_torch_rank(model, stage, int(length), args, n)
        return bench_torch(model, stage, int(length), args)
    except Exception as e:  # noqa: BLE001 - an OOM in one config must not stop the table
        traceback.print_exc()
        return {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:80]}", "failed": True}


def _run_peer_child(passthrough: list[str], spec: str, gpus: int = 1, timeout: float | None = None) -> dict:
    # A fresh process per configuration: peak-memory counters never reset and the GPU must be free for the next.
    cmd = [sys.executable, os.path.abspath(__file__), *passthrough, "--one", f"{spec},{gpus}"]
    if gpus > 1:
        return _torch_peer.run_peer_ranks(cmd, gpus, timeout)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
            setups.append((f"jax {n}dev {'fsdp x seq' if args.mesh == 'seq' else 'fsdp'} {remats[0]}", n, remats[0]))
    return setups


def peer_ratios(results: list[dict]) -> list[float | None]:
    """Per row: a JAX row's per-GPU tokens/s over the PyTorch peer's on as many GPUs, same model, stage and pair
    (one device, or --mesh fsdp: a pair per device, as the peer trains); None elsewhere."""
    peers = {(r["model"], r["stage"], r["length"], r["devices"]): r.get("tokens_per_s_per_gpu")
             for r in results if r.get("side") == "pytorch"}
    out = []
    for r in results:
        peer = peers.get((r.get("model"), r.get("stage"), r.get("length"), r.get("devices")))
        same_work = r.get("side") == "jax" and (r.get("devices") == 1 or r.get("mesh") == "fsdp")
        ours = r.get("tokens_per_s_per_gpu")
        out.append(ours / peer if same_work and ours and peer else None)
    return out


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
        res = run_peer(args.one, args)
        failed = bool(res and res.pop("failed", False))
        if res is not None:
            print("RESULT " + json.dumps(res), flush=True)
        if failed and len(args.one.split(",")) > 3 and int(args.one.split(",")[3]) > 1:
            sys.stderr.flush()
            os._exit(1)  # a failed rank: no teardown (the others wait in a collective); the parent stops them
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
                            "layout": args.layout, "remat": remat, "side": "jax", "mesh": args.mesh if n > 1 else None}
                    rows.append((MODELS[model], stage, f"2x{length}", name, res))
                    print(rows[-1], flush=True)
                    if args.json:
                        with open(args.json, "a", encoding="utf-8") as f:
                            f.write(json.dumps(res) + "\n")
                    return res

                search_longest(trains, args.search_start, args.search_step, args.search_max)
    for model in args.models.split(",") if not args.search else ():
        for stage in args.stages.split(","):
            failed: set[tuple] = set()  # (side, device count) that already failed at a shorter length
            for length in lengths:
                runs = [("jax", f"jax {n}dev" + ({"seq": " fsdp x seq", "fsdp": " fsdp"}[args.mesh] if n > 1 else ""),
                         n) for n in (int(d) for d in args.devices.split(","))]
                if not args.no_torch:
                    runs += [("pytorch", f"pytorch {n}dev" + (" fsdp2" if n > 1 else ""), n)
                             for n in (int(d) for d in args.peer_gpus.split(","))]
                for side, name, n in runs:
                    if (side, n) in failed:
                        res = {"skipped": "a shorter pair already failed"}
                    else:
                        res = (bench_jax(model, stage, length, n, args) if side == "jax"
                               else _run_peer_child(passthrough, f"{model},{stage},{length}", n, args.peer_timeout))
                        if "skipped" in res:
                            failed.add((side, n))
                    res |= {"model": MODELS[model], "stage": stage, "length": length, "run": name, "side": side,
                            "devices": n, "layout": None if side == "pytorch" else args.layout,
                            "mesh": None if side == "pytorch" or n == 1 else args.mesh,
                            "remat": None if side == "pytorch" else args.remat}
                    rows.append((MODELS[model], stage, f"2x{length}", name, res))
                    print(rows[-1], flush=True)
                    if args.json:
                        with open(args.json, "a", encoding="utf-8") as f:
                            f.write(json.dumps(res) + "\n")
    header = ("| model | stage | pair | run | tokens/s | per GPU | ours / peer per GPU | step s | MFU | peak GiB | "
              "predicted GiB | host GiB predicted pinned / peak RSS | remat / note |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [header]
    ratios = peer_ratios([r for *_, r in rows])
    for (model, stage, pair, name, r), ratio in zip(rows, ratios):
        lines.append(f"| {model}{' (tiny)' if args.smoke else ''} | {stage} | {pair} | {name} | "
                     f"{_fmt(r.get('tokens_per_s'), '.0f')} | {_fmt(r.get('tokens_per_s_per_gpu'), '.0f')} | "
                     f"{_fmt(ratio, '.2f')} | {_fmt(r.get('step_s'), '.3f')} | "
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
