"""Benchmark training steps (SimPO and Bradley-Terry) of the JAX trainer against the PyTorch peer.

    python scripts/bench_train.py                 # GPU: Qwen3-8B and Llama-3.1-8B shapes, random weights
    python scripts/bench_train.py --smoke         # tiny shapes on the CPU (checks the script runs)

For each model shape, stage and pair length L (chosen and rejected of L tokens each; `--layout rows`, the
default: one sequence per row, attention without segment ids; `packed`: one row of 2 L with segment ids) it
times full fine-tuning steps with random weights initialised in place (sharded; no checkpoint on disk):
- JAX: on each device count of `--devices` (default 1 and 2): n > 1 devices as fsdp x seq (the pair's rows
  split over all n by zigzag ring attention, parameters and AdamW state sharded over all n), when visible;
- the PyTorch peer in the same run (each configuration in its own process): HF transformers, SDPA, gradient checkpointing, AdamW, bf16 weights, the pair
  as a batch of 2 sequences.
It prints tokens/s, MFU (reference section 7: FLOPs = 6 N_matmul + 6 L H d S per token, 989 TFLOP/s peak per
H100/H200) and peak memory, as a table, and appends the table to docs/benchmarks.md (not with --smoke unless
--append is given). `--json` keeps every figure, `--plot` draws tokens/s and MFU against pair length, ours
against the peer, and the last lines name the longest pair each device count trained (list longer lengths
in `--lengths` to search: a length that does not fit shows as out of memory and stops that device count).
`--profile DIR` writes a jax.profiler trace of one more step of each JAX configuration.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np

MODELS = {"qwen3_8b": "Qwen3-8B", "llama31_8b": "Llama-3.1-8B"}
TINY = {"qwen3_8b": "tiny_qwen3", "llama31_8b": "tiny_llama"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, CPU, 2 timed steps")
    p.add_argument("--models", default="qwen3_8b,llama31_8b", help="comma list of " + ", ".join(MODELS))
    p.add_argument("--stages", default="simpo,bt", help="comma list of simpo, bt")
    p.add_argument("--lengths", default="16384,32768", help="tokens per response sample L (row = 2 L)")
    p.add_argument("--devices", default="1,2",
                   help="JAX device counts to run (n > 1: fsdp x seq, the sequence ring over all n)")
    p.add_argument("--steps", type=int, default=3, help="timed steps (after the compile step and --warmup)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after the compile step (a fresh JAX "
                   "process runs its first steps after compiling up to 1.6x slower: H200, 2 x 8K tokens)")
    p.add_argument("--param-dtype", default="bfloat16", help="JAX master weights / AdamW state dtype "
                   "(bfloat16 matches the peer's memory; float32 for fp32 masters)")
    p.add_argument("--remat", default="full", help="ModelConfig.remat policy (save_attention_out: also sets "
                   "longrm_jax.models.xla_flags.GPU_TRAIN_XLA_FLAGS in the child)")
    p.add_argument("--layout", default="rows", choices=("rows", "packed"), help="data.layout of the JAX step")
    p.add_argument("--json", default=None, help="append one JSON object per configuration to this file")
    p.add_argument("--plot", default=None, help="PNG: tokens/s and MFU against pair length, ours vs the peer")
    p.add_argument("--profile", default=None, help="directory for a jax.profiler trace of one extra step")
    p.add_argument("--breakdown", action="store_true", help="also time the step's parts separately: loss forward, "
                   "the gradient program (forward + backward), and the whole step again after them (JAX runs; "
                   "needs memory for one more gradient)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--append", default=None, help="markdown file to append the table to "
                   "(default docs/benchmarks.md; with --smoke only if given)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one config, print JSON
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ batches


def pair_batch(length: int, vocab: int, seed: int = 0) -> dict:
    """One row: chosen then rejected sample of ``length`` tokens; the last 10% of each is response. Both are
    exactly ``length`` long, so the packed row (segment ids 1, 2) is also the slotted row of the "rows" layout
    (slot r = sample r) and, reshaped to [2, length], the peer's batch."""
    rng = np.random.default_rng(seed)
    t = 2 * length
    ids = rng.integers(10, vocab - 10, (1, t)).astype(np.int32)
    seg = np.repeat(np.array([1, 2], np.int32), length)[None]
    pos = np.tile(np.arange(length, dtype=np.int32), 2)[None]
    mask = np.zeros((1, t), np.int32)
    resp = max(1, length // 10)
    mask[0, length - resp:length] = 1
    mask[0, t - resp:] = 1
    return {"input_ids": ids, "positions": pos, "segment_ids": seg, "loss_mask": mask,
            "num_groups": np.ones((1,), np.int32)}


# ------------------------------------------------------------------------------------------------ JAX


def bench_jax(model: str, stage: str, length: int, n_devices: int, args) -> dict:
    import jax

    from longrm_jax.parallel.mesh import make_mesh
    from longrm_jax.training import batches as batch_lib
    from longrm_jax.training.config import load_config
    from longrm_jax.training.metrics import peak_flops, step_flops
    from longrm_jax.training.model_setup import init_random, preset_config, with_training_numerics
    from longrm_jax.training.state import create_state, lr_schedule, make_optimizer, param_rules
    from longrm_jax.training.steps import StageSpec, jit_train_step, make_train_step

    if len(jax.devices()) < n_devices:
        return {"skipped": f"{n_devices} devices needed, {len(jax.devices())} visible"}
    seq = n_devices  # one sequence over every device (ring attention); parameters sharded over fsdp x seq
    preset = TINY[model] if args.smoke else model
    overrides = ["model.overrides.vocab_size=1000"] if args.smoke else []
    cfg = load_config(None, [
        f"stage={stage}", f"model.preset={preset}", f"model.head={'classifier' if stage == 'bt' else 'causal_lm'}",
        f"model.compute_dtype={'float32' if args.smoke else 'bfloat16'}", f"model.param_dtype={args.param_dtype}",
        f"model.remat={args.remat}", f"data.layout={args.layout}",
        f"data.seq_len={(1 if args.layout == 'rows' else 2) * length}", "data.batch_rows=1", "mesh.data=1",
        "mesh.fsdp=1", f"mesh.seq={seq}", "mesh.param_axes=[fsdp, seq]", "loss.chunk_tokens=4096",
    ] + overrides)
    mesh = make_mesh(1, 1, seq, 1, devices=jax.devices()[:n_devices])
    mcfg = with_training_numerics(preset_config(cfg), cfg)
    codec, values = init_random(mcfg, mesh, 0, param_rules(cfg))
    tx = make_optimizer(cfg, 1000)
    state, sh = create_state(cfg, codec, values, tx, mesh, jax.random.key(1))
    del values
    slots = 2 if args.layout == "rows" else None
    spec = StageSpec(stage, 1, 1, slotted=slots is not None)
    step = jit_train_step(make_train_step(cfg, codec, tx, spec, lr_schedule(cfg, 1000)), sh,
                          batch_lib.batch_shardings(mesh, slotted=slots is not None))
    host = pair_batch(length, mcfg.vocab_size)
    with jax.set_mesh(mesh):
        batch = batch_lib.to_global(batch_lib.prepare(host, seq_shards=seq, slots=slots), mesh)
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        compile_s = time.perf_counter() - t0
        for _ in range(args.warmup):
            state, m = step(state, batch)
        jax.block_until_ready(m)
        times = []
        for _ in range(args.steps):  # each step timed alone: the spread shows whether it settled
            t0 = time.perf_counter()
            state, m = step(state, batch)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t0)
        loss = float(jax.device_get(m)["loss"])
        dt = float(np.median(times))
        if args.profile:
            with jax.profiler.trace(os.path.join(args.profile, f"{model}_{stage}_{length}_{n_devices}dev")):
                state, m = step(state, batch)
                jax.block_until_ready(m)
        mem = [d.memory_stats() or {} for d in mesh.devices.flat]  # the step's peak, before the parts below
        # Last: its split-step timing consumes the state.
        parts = (_time_parts(cfg, codec, tx, spec, state, batch, args.steps, sh,
                             batch_lib.batch_shardings(mesh, slotted=slots is not None), step)
                 if args.breakdown else {})
    flops = step_flops(mcfg, cfg.head, host["segment_ids"])
    peak = peak_flops(list(mesh.devices.flat))
    peak_mem = max((s.get("peak_bytes_in_use", 0) for s in mem), default=0)
    del state
    gc.collect()
    return {"tokens_per_s": 2 * length / dt, "step_s": dt, "mfu": flops / dt / peak if peak else None,
            "peak_gib": peak_mem / 2**30 if peak_mem else None, "loss": loss, "compile_s": compile_s,
            "step_times": times,
            "device": jax.devices()[0].device_kind, **parts}


def _time_parts(cfg, codec, tx, spec, state, batch, steps: int, state_sh, batch_sh, step) -> dict:
    """Seconds of the step's parts, each jitted alone: where a slow step loses its time. Consumes ``state``."""
    import jax
    import optax

    from longrm_jax.training.state import effective_params
    from longrm_jax.training.steps import batch_count, loss_sums, make_train_step

    def loss(params, batch):
        model = codec.model(effective_params(cfg, params, state.frozen))
        return loss_sums(model, batch, cfg, spec)[0] / batch_count(batch, spec)

    def timed(fn, *a):
        jax.block_until_ready(fn(*a))
        t0 = time.perf_counter()
        for _ in range(steps):
            out = fn(*a)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / steps, out

    out = {}
    out["part_forward_s"], _ = timed(jax.jit(loss), state.params, batch)
    # The trainer's own gradient program, jitted as jit_train_step does.
    gradients = jax.jit(make_train_step(cfg, codec, tx, spec, lambda _: 0.0).gradients,
                        in_shardings=(state_sh, batch_sh), out_shardings=(state_sh.params, None))
    out["part_grad_s"], (grads, _) = timed(gradients, state, batch)
    out["part_norm_s"], _ = timed(jax.jit(optax.global_norm), grads)
    del grads
    # The whole step again, gradient then donated update, now that the process has run a while.
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = step(state, batch)
    jax.block_until_ready(m)
    out["part_split_step_s"] = (time.perf_counter() - t0) / steps
    return out


# ------------------------------------------------------------------------------------------------ PyTorch


def bench_torch(model: str, stage: str, length: int, args) -> dict:
    import torch
    import transformers

    from longrm_jax.models.config import to_hf_config
    from longrm_jax.training.config import load_config
    from longrm_jax.training.metrics import matmul_params
    from longrm_jax.training.model_setup import preset_config

    preset = TINY[model] if args.smoke else model
    cfg = load_config(None, [f"model.preset={preset}"] + (["model.overrides.vocab_size=1000"] if args.smoke else []))
    head = "classifier" if stage == "bt" else "causal_lm"
    mcfg = preset_config(cfg).replace(head=head)
    if mcfg.pad_token_id is None:  # tiny presets take their ids from a tokenizer; HF pools at the last non-pad
        mcfg = mcfg.replace(pad_token_id=0)
    hf_cfg = transformers.AutoConfig.for_model(**to_hf_config(mcfg))
    hf_cfg._attn_implementation = "sdpa"
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cls = transformers.AutoModelForSequenceClassification if head == "classifier" else transformers.AutoModelForCausalLM
    with torch.device(device):
        net = cls.from_config(hf_cfg, dtype=dtype)
    net.gradient_checkpointing_enable()
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-6, betas=(0.9, 0.95), weight_decay=0.0)
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
    flops = 6.0 * matmul_params(mcfg, head) * 2 * length + 6.0 * mcfg.num_layers * mcfg.num_heads * mcfg.head_dim \
        * 2 * length**2
    peak = 989e12 if device == "cuda" and any(k in torch.cuda.get_device_name() for k in ("H100", "H200")) else None
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    del net, opt
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"tokens_per_s": 2 * length / dt, "step_s": dt, "mfu": flops / dt / peak if peak else None,
            "peak_gib": peak_mem, "loss": loss, "step_times": times}


# ------------------------------------------------------------------------------------------------ main


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def run_one(spec: str, args) -> dict:
    """Child process: one configuration ``model,stage,length,devices`` (devices 0 = the PyTorch peer)."""
    model, stage, length, n = spec.split(",")
    # A training process owns its GPU: let XLA's pool take 95% of it (JAX's default is 75%), as the peer may.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    if int(n) > 0 and args.remat == "save_attention_out" and not args.smoke:
        from longrm_jax.models.xla_flags import GPU_TRAIN_XLA_FLAGS, add_gpu_xla_flags

        add_gpu_xla_flags(GPU_TRAIN_XLA_FLAGS)  # before the first device use (docs/perf_training.md)
    try:
        if int(n) == 0:
            return bench_torch(model, stage, int(length), args)
        return bench_jax(model, stage, int(length), int(n), args)
    except Exception as e:  # noqa: BLE001 - an OOM in one config must not stop the table
        traceback.print_exc()
        return {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"}


def _run_child(passthrough: list[str], spec: str) -> dict:
    # A fresh process per configuration: JAX preallocates GPU memory and peak-memory counters never reset,
    # so neither the peer nor the next size may share a process with a run.
    cmd = [sys.executable, os.path.abspath(__file__), *passthrough, "--one", spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if lines:
        return json.loads(lines[-1][len("RESULT "):])
    sys.stderr.write(proc.stderr[-4000:])
    return {"skipped": f"child exited {proc.returncode} (killed / out of memory?)"}


def _parts_note(r: dict) -> str:
    if "part_grad_s" not in r:
        return ""
    return (f"forward {r['part_forward_s']:.3f} s, gradient program {r['part_grad_s']:.3f} s, "
            f"grad norm {r['part_norm_s']:.3f} s, whole step later in the process {r['part_split_step_s']:.3f} s")


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
        print("RESULT " + json.dumps(run_one(args.one, args)), flush=True)
        return 0
    lengths = [64] if args.smoke else [int(x) for x in args.lengths.split(",")]
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--one")]
    rows = []
    for model in args.models.split(","):
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
                        res = _run_child(passthrough, f"{model},{stage},{length},{n}")
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
    header = "| model | stage | pair | run | tokens/s | step s | MFU | peak GiB | note |\n|---|---|---|---|---|---|---|---|---|"
    lines = [header]
    for model, stage, pair, name, r in rows:
        lines.append(f"| {model}{' (tiny)' if args.smoke else ''} | {stage} | {pair} | {name} | "
                     f"{_fmt(r.get('tokens_per_s'), '.0f')} | {_fmt(r.get('step_s'), '.3f')} | "
                     f"{_fmt(None if r.get('mfu') is None else 100 * r['mfu'], '.1f')} | "
                     f"{_fmt(r.get('peak_gib'), '.1f')} | {r.get('skipped', '') or _parts_note(r)} |")
    table = "\n".join(lines + [""] + longest_pairs([r for *_, r in rows]))
    print(table)
    if args.plot:
        plot_scaling([r for *_, r in rows], args.plot)
    target = args.append or (None if args.smoke else "docs/benchmarks.md")
    if target:
        dev = next((r["device"] for *_, r in rows if "device" in r), "unknown device")
        with open(target, "a", encoding="utf-8") as f:
            f.write(f"\n### Training steps ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                    f"{dev}, scripts/bench_train.py, param dtype {args.param_dtype}, remat {args.remat}, "
                    f"layout {args.layout})\n\n"
                    f"{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
