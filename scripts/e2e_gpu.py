"""End to end on one GPU, through the user's commands only: HF checkpoint in, train, kill, resume, export,
evaluate. One model per call (the device machines give a command 10 minutes):

    python scripts/e2e_gpu.py --model qwen3_8b      # causal LM: SimPO, then GRM evaluation (generation)
    python scripts/e2e_gpu.py --model llama31_8b    # classifier: Bradley-Terry with the shipped LoRA, DisRM
    python scripts/e2e_gpu.py --smoke --model qwen3_8b   # tiny shapes on the CPU (checks the script)
    python scripts/e2e_gpu.py --model qwen3_8b --scratch /dev/shm   # a 64 GB disk: HF checkpoints in RAM
    python scripts/e2e_gpu.py --model qwen3_8b --devices 4          # a node: the pair over 4 GPUs, 4 replicas

Phases, each timed (wall seconds; peak GPU memory where a GPU is visible: `nvidia-smi` polled while the
phase runs, with XLA's preallocation off outside training, and the trainer's own `peak_gib` for training):
1. `write_hf`: a randomly initialised model of the preset's shapes written as an HF checkpoint (bf16
   safetensors, the bundled tokenizer) - the stand-in for a downloaded checkpoint;
2. `train`: `python -m longrm_jax.train` from that directory with the stage's shipped config, a 2 x L pair
   per step (rows layout), a checkpoint every step; SIGKILL once the first checkpoint is complete;
3. `resume`: the same command with `--resume`, to the last step;
4. `export`: `python -m longrm_jax.export` of the training checkpoint (LoRA merged) as bf16 HF;
5. `data`: `python -m longrm_jax.data.synthetic` writes a Long-RewardBench with contexts of about L tokens;
6. `evaluate`: `python -m longrm_jax.evaluate` on a few samples (`--is-disrm` for the classifier).

``--devices N``: training splits each pair over N devices (``mesh.seq=N``, ring attention; ``--set`` overrides
it, e.g. ``--set mesh.seq=1 --set mesh.fsdp=4 --set data.batch_rows=8`` for a pair per GPU) and evaluation runs
one replica per device (``--replicas N``). With --smoke the N devices are fake CPU devices and the replicas CPU
processes. The losses of the steps that ran both before the kill and after the resume are compared (the
``resume_loss_max_rel_diff`` of phases.json; 0 for a deterministic program).
A table of the phases is printed and appended to docs/benchmarks.md (`--no-record`: print only; with --smoke only
to a file named by --benchmarks-md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import _bench

ROOT = _bench.REPO_ROOT
MODELS = {  # preset -> (stage, shipped config, evaluate flags)
    "qwen3_8b": ("simpo", "configs/qwen3_8b_grm_simpo.yaml", []),
    "llama31_8b": ("bt", "configs/llama31_8b_disrm_bt.yaml", ["--is-disrm"]),
}
TINY = {"qwen3_8b": "tiny_qwen3", "llama31_8b": "tiny_llama"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--length", type=int, default=32768, help="tokens per sequence L (pair = 2 L)")
    p.add_argument("--steps", type=int, default=None, help="training steps; the kill comes once the first checkpoint "
                   "is complete, so later steps must still be running then (default 2; 40 with --smoke, where a "
                   "step takes milliseconds)")
    p.add_argument("--work", default=None, help="working directory (default: a fresh one under /tmp); the "
                   "training checkpoints go here")
    p.add_argument("--scratch", default=None, help="directory for the HF checkpoints (input and export) and the "
                   "benchmark files, e.g. /dev/shm when the disk holds only the training checkpoint (default: "
                   "--work)")
    p.add_argument("--eval-samples", type=int, default=1, help="samples per task file (--limit)")
    p.add_argument("--eval-tasks", default="LongQA,Safety", help="Long-RewardBench task files to evaluate")
    p.add_argument("--max-new-tokens", type=int, default=64, help="GRM generation budget per judgement")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a training setting after the script's own (repeatable; it wins over them), e.g. the H100's "
                        "full-parameter recipe: --set model.remat=offload_layer_inputs --set "
                        "model.mlp_chunk_tokens=8192 --set optim.offload_state=true")
    _bench.add_common_flags(p, iters=None, warmup=None, smoke_help="tiny shapes on the CPU")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--devices", type=int, default=1, help="devices of the node: training over mesh.seq=N, "
                   "evaluation with --replicas N (default 1)")
    return p.parse_args(argv)


class GpuMemoryPoller:
    """Largest `nvidia-smi` memory.used (GiB) while the context is open; None without nvidia-smi."""

    def __init__(self):
        self.peak = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if shutil.which("nvidia-smi") else None

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                used = max(float(x) for x in out.split()) / 1024
                self.peak = used if self.peak is None else max(self.peak, used)
            except (ValueError, subprocess.SubprocessError, OSError):
                pass
            self._stop.wait(0.5)

    def __enter__(self):
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join()


def _env(smoke: bool, training: bool, devices: int = 1) -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
        # one CPU device per phase (training: --devices of them); other XLA flags (e.g. the test suite's) are kept
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        if training and devices > 1:
            flags.append(f"--xla_force_host_platform_device_count={devices}")
        if flags:
            env["XLA_FLAGS"] = " ".join(flags)
        else:
            env.pop("XLA_FLAGS", None)
    elif training:
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    else:
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # nvidia-smi then shows what is used
    return env


def _checkpoint_done(ckpt_dir: str) -> bool:
    """Some step's checkpoint is complete: a finalised orbax step directory (orbax renames its temporary
    directory when the save completes). Any step, not step 1: with `checkpoint.keep=1` step 1's directory is
    deleted once step 2 is saved, so a poll that looked for it alone could miss it on a loaded machine."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return False
    return any(n.isdigit() and os.path.isdir(os.path.join(ckpt_dir, n, "state")) for n in names)


def _cli(args_list: list[str]) -> list[str]:
    return [sys.executable, "-m", *args_list]


class Phases:
    def __init__(self):
        self.rows: list[dict] = []

    def run(self, name: str, cmd: list[str], *, env: dict, kill_when=None, peak_from=None, log_dir: str) -> int:
        """Run ``cmd``; with ``kill_when`` (a predicate) SIGKILL it once that holds. Records wall time / peak."""
        log_path = os.path.join(log_dir, f"{name}.log")
        t0 = time.perf_counter()
        with open(log_path, "w", encoding="utf-8") as log, GpuMemoryPoller() as poller:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            killed = False
            while proc.poll() is None:
                if kill_when is not None and kill_when():
                    proc.send_signal(signal.SIGKILL)
                    killed = True
                    proc.wait()
                    break
                time.sleep(0.1)
        wall = time.perf_counter() - t0
        rc = proc.returncode
        peak = peak_from() if peak_from else None
        self.rows.append({"phase": name, "wall_s": wall, "peak_gib": peak if peak is not None else poller.peak,
                          "rc": rc, "killed": killed, "command": " ".join(cmd[1:])})
        print(f"{name}: {wall:.1f} s, rc {rc}{' (killed as planned)' if killed else ''}", flush=True)
        if rc != 0 and not killed:
            with open(log_path, encoding="utf-8") as f:
                sys.stderr.write(f.read()[-4000:])
            raise SystemExit(f"phase {name} failed (rc {rc}); log: {log_path}")
        return rc


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _check_disk(work: str, scratch: str, hf_dir: str, full_params: bool) -> None:
    """Stop before training when the disks cannot hold the chain. Training checkpoints hold the bf16 weights (x 3
    with AdamW's two moments for full fine-tuning; LoRA saves the frozen base once plus small adapters); the runs
    use `checkpoint.on_low_disk=delete_oldest`, so one is on disk at a time where two do not fit. The export is
    one more copy of the weights, on the scratch disk."""
    weights = _dir_bytes(hf_dir)
    ckpt = (3 if full_params else 1) * weights
    same = os.stat(work).st_dev == os.stat(scratch).st_dev
    needs = {work: ckpt + (weights if same else 0)}
    if not same:
        needs[scratch] = weights
    for where, need in needs.items():
        free = shutil.disk_usage(where).free
        if free < need:
            raise SystemExit(f"not enough disk under {where}: about {need / 1e9:.0f} GB more are needed (weights "
                             f"{weights / 1e9:.1f} GB; a training checkpoint {'3' if full_params else '1'} x that"
                             f"{', the export' if where == scratch else ''}), {free / 1e9:.0f} GB are free; give "
                             "--work (training checkpoints) or --scratch (HF checkpoints) a larger disk")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--write-hf"]:  # the write_hf phase's child process: PRESET HEAD DIR
        _bench.write_random_hf(*argv[1:4])
        return 0
    args = parse_args(argv)
    stage, config, eval_flags = MODELS[args.model]
    if args.steps is None:
        args.steps = 40 if args.smoke else 2
    preset = TINY[args.model] if args.smoke else args.model
    length = 128 if args.smoke else args.length
    work = args.work or os.path.join("/tmp", f"e2e_{args.model}_{os.getpid()}")
    scratch = os.path.join(args.scratch, os.path.basename(work)) if args.scratch else work
    os.makedirs(work, exist_ok=True)
    os.makedirs(scratch, exist_ok=True)
    hf_init, run_dir = os.path.join(scratch, "hf_init"), os.path.join(work, "run")
    hf_out, lrb = os.path.join(scratch, "hf_trained"), os.path.join(scratch, "lrb")
    eval_dir = os.path.join(work, "eval")
    phases = Phases()
    if args.smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"

    # In a child process: JAX in this process would keep its device memory for the rest of the chain, and the
    # trainer started next would find only what is left of the GPU (a 37 GiB pool instead of 132 on an H200).
    phases.run("write_hf", [sys.executable, os.path.abspath(__file__), "--write-hf", preset,
                            "classifier" if stage == "bt" else "causal_lm", hf_init], env=_env(args.smoke, False),
               log_dir=work)
    _check_disk(work, scratch, hf_init, full_params=stage != "bt")
    train = ["longrm_jax.train", "--config", os.path.join(ROOT, config)]
    # save_host_gb: the 8B full-parameter state (49 GB) is copied to host memory in batches, not at once (a
    # 128 GB host with the HF checkpoints in /dev/shm killed the unbounded save). bf16 weights (and, for full
    # fine-tuning, AdamW moments): an 8B model's full-parameter state fits one H200
    # that way, and the disk of the lent GPU machines (64 GB) holds the HF checkpoint, a training checkpoint and
    # the export. save_attention_out: the fastest policy that fits a 2 x 32K pair (auto would first compile the
    # policy without rematerialisation, which does not, in each of the two training phases).
    for item in [f"model.init={hf_init}", f"data.tokenizer={hf_init}",
                 f"model.remat={'auto' if args.smoke else 'save_attention_out'}", "model.param_dtype=bfloat16",
                 f"model.compute_dtype={'float32' if args.smoke else 'bfloat16'}",
                 "data.source=synthetic", "data.eval_source=null", "data.layout=rows", f"data.seq_len={length}",
                 "data.batch_rows=2", "grad_accum=1", "data.num_buckets=1", f"data.num_train={4 * args.steps}",
                 f"data.synthetic={{lengths: [{max(length - 64, 8)}]}}", f"steps={args.steps}", "log_every=1",
                 "eval_before=false", "eval_after=false", "checkpoint.every=1", "checkpoint.keep=1",
                 "checkpoint.overwrite=true", "checkpoint.on_low_disk=delete_oldest",
                 "checkpoint.save_host_gb=8", "mesh.data=1", "mesh.fsdp=1", f"mesh.seq={args.devices}",
                 f"output_dir={run_dir}",
                 *args.overrides]:
        train += ["--set", item]
    ckpt_dir = os.path.join(run_dir, "checkpoints")

    def train_peak():
        path = os.path.join(run_dir, "metrics.jsonl")
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            peaks = [json.loads(line).get("peak_gib") for line in f if line.strip()]
        peaks = [p for p in peaks if p is not None]
        return max(peaks) if peaks else None

    phases.run("train", _cli(train), env=_env(args.smoke, True, args.devices), kill_when=lambda: _checkpoint_done(ckpt_dir),
               peak_from=train_peak, log_dir=work)
    if not phases.rows[-1]["killed"]:
        raise SystemExit("training finished before its first checkpoint was complete, so the kill and resume were "
                         "not exercised: give more --steps")
    phases.run("resume", _cli(train + ["--resume"]), env=_env(args.smoke, True, args.devices), peak_from=train_peak,
               log_dir=work)
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        steps = [json.loads(line)["step"] for line in f if line.strip() and '"train"' in line]
    if steps[-1] != args.steps:
        raise SystemExit(f"resume ended at step {steps[-1]}, expected {args.steps}")
    phases.rows[-1].update(_resume_comparison(work))
    print(f"resume: {phases.rows[-1]['resume_note']}", flush=True)
    phases.run("export", _cli(["longrm_jax.export", "--checkpoint", ckpt_dir, "--out", hf_out, "--dtype", "bfloat16"]),
               env=_env(args.smoke, False), log_dir=work)
    phases.run("data", _cli(["longrm_jax.data.synthetic", "--out", lrb, "--num-train", "0", "--num-eval", "0",
                             "--bench-per-task", str(args.eval_samples), "--lengths", str(max(length - 512, 64))]),
               env=_env(args.smoke, False), log_dir=work)
    phases.run("evaluate", _cli(["longrm_jax.evaluate", "--model-path", hf_out, "--data-path", os.path.join(lrb, "long_rewardbench"), "--save-path",
                                 eval_dir, "--limit", str(args.eval_samples), "--tasks", *args.eval_tasks.split(","),
                                 "--max-new-tokens", str(args.max_new_tokens), "--no-progress",
                                 "--allow-no-verdicts", "--replicas", str(args.devices), *eval_flags]),
               # (--allow-no-verdicts: a few steps from random weights)
               env=_env(args.smoke, False), log_dir=work)
    if not os.path.exists(os.path.join(eval_dir, "results.csv")):
        raise SystemExit("evaluate wrote no results.csv")

    device = "cpu (smoke)" if args.smoke else _device_name()
    table = ["| phase | wall s | peak GiB | note |", "|---|---|---|---|"]
    for r in phases.rows:
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        note = "SIGKILL after the first checkpoint" if r["killed"] else r.get("resume_note", "")
        table.append(f"| {r['phase']} | {r['wall_s']:.1f} | {peak} | {note} |")
    total = sum(r["wall_s"] for r in phases.rows)
    table.append(f"| total | {total:.1f} | | |")
    print("\n".join(table))
    path = _bench.record_path(args)
    if path:
        _bench.append_section(path, f"end to end, {args.model}", command=_bench.command_line(argv), device=device,
                              details=f"stage {stage}, {config}, 2 x {length} tokens per step, {args.devices} "
                                      f"device(s)", table=table)
    with open(os.path.join(work, "phases.json"), "w", encoding="utf-8") as f:
        json.dump(phases.rows, f, indent=1)
    if not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    if not args.keep and scratch != work:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _logged_losses(log_path: str) -> dict[int, float]:
    """{step: loss} of the trainer's console lines (``step N/M  loss X ...``) in a phase's log."""
    import re

    pattern = re.compile(r"^step (\d+)/\d+\s+loss (\S+)")
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return {int(m.group(1)): float(m.group(2)) for m in map(pattern.match, f) if m}


def _resume_comparison(work: str) -> dict:
    """The resumed run's losses against the killed run's at the steps both ran: the steps after the checkpoint
    the resume started from, which the killed run had logged before the kill."""
    import re

    before, after = _logged_losses(os.path.join(work, "train.log")), _logged_losses(os.path.join(work, "resume.log"))
    with open(os.path.join(work, "resume.log"), encoding="utf-8", errors="replace") as f:
        found = re.search(r"resumed from .* at step (\d+)", f.read())
    start = int(found.group(1)) if found else 0
    both = sorted(step for step in before if step in after and step > start)
    if not both:
        return {"resume_loss_max_rel_diff": None, "resume_from_step": start,
                "resume_note": f"resumed at step {start}; no step ran both before the kill and after the resume"}
    worst = max(abs(after[k] - before[k]) / max(abs(before[k]), 1e-12) for k in both)
    return {"resume_loss_max_rel_diff": worst, "resume_from_step": start,
            "resume_note": f"resumed at step {start}; steps {both[0]}-{both[-1]} ran before the kill and again: "
                           f"losses within {worst:.1e} relative (as printed, 4 decimals)"}


def _device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip().splitlines()
        return out[0] if out else "unknown device"
    except (OSError, subprocess.SubprocessError):
        return "unknown device"


if __name__ == "__main__":
    sys.exit(main())
