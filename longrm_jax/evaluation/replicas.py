"""One evaluation queue per GPU: the samples shared out by predicted cost, each share judged by a process of its
own on one GPU (weights replicated, the GRM's continuous batching intact), the predictions merged in the data's
order.

Why processes and not one program over a mesh: a judge's continuous batching is a host loop that admits and
retires rows between decode chunks; one loop per GPU keeps each GPU busy without the others' host work in its
way, and each process's JAX sees only its own GPU, so nothing (weights, caches, compiles) is shared by accident.
A replica is ``python -m longrm_jax.evaluate`` itself on its share (``--config`` the run's settings with the
share's ``only_samples``: :func:`replica_config`), writing its outputs into
``{save_path}/replicas/r{i}/``: its own ``partial/`` journals make ``--resume`` work per replica, and the split
is a pure function of the samples and the replica count, so a resumed run hands each replica the same share.

Each sample's per-row computation does not depend on which rows share its batch, so the merged predictions are
the one-device run's (tests/test_evaluation_replicas.py compares them on the CPU).

A sample too long for one GPU (its predicted cache and prefill do not fit beside the weights; or longer than
``--replica-max-tokens``) goes to no replica: once the replicas are done, the parent judges those samples itself
with one program whose ``seq`` axis spans the replicas' devices (ring-attention prefill, the cache split over the
devices), as ``--mesh seq=N`` would (:func:`split_long`; runner.judge_long_on_mesh).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import yaml
from tqdm.auto import tqdm

from longrm_jax.cli_support import visible_gpu_ids
from longrm_jax.evaluation.grm.estimate import DEVICES, prefill_flops
from longrm_jax.evaluation.grm.slot_plan import kv_cache_bytes, plan_slots
from longrm_jax.evaluation.samples import EvalSample
from longrm_jax.evaluation.timings import Timings
from longrm_jax.hf.load import read_hf_config
from longrm_jax.models.config import from_hf_config
from longrm_jax.models.flop_counts import decoder_matmul_params
from longrm_jax.ops import slow_paths
from longrm_jax.parallel.topology import GiB

logger = logging.getLogger(__name__)

REPLICA_DIR = "replicas"
# Characters per token of the cost estimate (English text with a BPE vocabulary of ~150K: ~4; code and CJK
# text less). It only weighs samples against each other, so a uniform error cancels.
CHARS_PER_TOKEN = 3.5
# Rows decoding together in the estimate's decode step (a replica's slot pool fills to tens of rows): the weight
# read of a step is shared by them.
DECODE_ROWS = 16
# A replica needs room beside its weights for the KV cache and activations: replicate only where the weights
# take at most this share of one device's memory; otherwise the run stays one program over the mesh.
MAX_WEIGHT_SHARE = 0.6
# The characters-per-token estimate undercounts code and CJK text: a sample is routed to a replica only when
# this many times its estimated tokens still fit one device.
LENGTH_MARGIN = 1.5


class ReplicaFailed(RuntimeError):
    """A replica process exited with an error; ``exit_code`` is its status (2: input refused, 4: does not fit)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code if exit_code in (2, 3, 4) else 1


# ------------------------------------------------------------------------------------------------ devices
def local_gpu_ids(environ=None) -> list[str]:
    """The GPUs this process's JAX would use, found without starting a backend (cli_support.visible_gpu_ids:
    CUDA_VISIBLE_DEVICES's entries when set, else the host's /dev/nvidiaN nodes); none when JAX_PLATFORMS
    names no GPU platform, and CUDA's "-1" (no device) is none."""
    environ = os.environ if environ is None else environ
    platforms = environ.get("JAX_PLATFORMS", "").lower()
    if platforms and not any(name in platforms for name in ("cuda", "gpu")):
        return []
    return [gpu for gpu in visible_gpu_ids(environ) if gpu != "-1"]


def gpu_memory_bytes(gpu_id: str) -> int | None:
    """Total memory of GPU ``gpu_id`` from nvidia-smi (None where it cannot say)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i",
                              gpu_id], capture_output=True, text=True, timeout=30, check=True).stdout
        return int(float(out.strip().splitlines()[0])) << 20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def weight_bytes(config, dtype: str) -> int:
    """Bytes of the decoder's weights in the compute dtype (embeddings included)."""
    embeddings = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    return (decoder_matmul_params(config) + embeddings) * (4 if dtype == "float32" else 2)


def plan_replicas(requested: str, mesh: dict | None, config, dtype: str, environ=None) -> tuple[list[str], str]:
    """(the devices to run one replica each on, why): ``requested`` is ``--replicas`` (``auto`` or a count).
    ``auto``: one per local GPU when there are several, no ``--mesh`` is given and the weights leave room for a
    cache on one GPU; otherwise none (an empty list: one program as before). A count runs that many: on GPUs
    the first ones, on a host without GPUs that many CPU processes (tests, or a many-core host)."""
    gpus = local_gpu_ids(environ)
    if requested == "auto":
        if mesh:
            return [], "--mesh given: one program over the mesh"
        if len(gpus) < 2:
            return [], f"{len(gpus)} GPU(s) visible"
        memory = gpu_memory_bytes(gpus[0])
        needed = weight_bytes(config, dtype)
        if memory is not None and needed > MAX_WEIGHT_SHARE * memory:
            return [], (f"weights of {needed / GiB:.1f} GiB leave too little of one GPU's {memory / GiB:.1f} "
                        "GiB for a cache: one program over all GPUs (--mesh) instead")
        return gpus, f"one replica per GPU ({len(gpus)}), weights replicated"
    count = int(requested)
    if count <= 1:
        return [], "--replicas 1"
    if gpus:
        if count > len(gpus):
            raise ValueError(f"--replicas {count}: only {len(gpus)} GPU(s) visible ({','.join(gpus)})")
        return gpus[:count], f"--replicas {count}: one per GPU"
    return ["cpu"] * count, f"--replicas {count}: {count} CPU processes (no GPU visible)"


# ------------------------------------------------------------------------------------------------ shares
def sample_tokens(sample: EvalSample) -> tuple[float, float]:
    """(prompt tokens, answer tokens) of ``sample``, estimated from characters (no tokenizer needed)."""
    prompt = sum(len(str(m.get("content", ""))) for m in sample.prompt_messages())
    answers = sum(len(a) for a in sample.answers)
    return prompt / CHARS_PER_TOKEN, answers / CHARS_PER_TOKEN


def sample_cost(sample: EvalSample, config, *, is_disrm: bool, both_orders: bool, max_new_tokens: int,
                share_prompt: bool = False) -> float:
    """Predicted seconds of judging ``sample`` (priced at the first known device's rates: only the ratios between
    samples matter). A GRM judgement is a prefill of prompt + answers and ``max_new_tokens`` decode steps that
    share the weight read with ``DECODE_ROWS`` rows and read the row's cache; a DisRM scores each answer after
    the prompt (the prompt once with ``share_prompt``)."""
    rates = DEVICES[0]
    flops_rate = rates.peak_flops * rates.prefill_mfu
    prompt, answers = sample_tokens(sample)
    n = max(1, len(sample.answers))
    if is_disrm:
        if share_prompt:
            return (prefill_flops(config, int(prompt)) + n * prefill_flops(config, int(answers / n))) / flops_rate
        return n * prefill_flops(config, int(prompt + answers / n)) / flops_rate
    length = prompt + answers
    prefill = prefill_flops(config, int(length)) / flops_rate
    step = (weight_bytes(config, "bfloat16") / DECODE_ROWS + kv_cache_bytes(config, length)) / (
        rates.bandwidth * rates.decode_efficiency)
    return (2 if both_orders else 1) * (prefill + max_new_tokens * step)


def one_device_columns(sample: EvalSample, *, is_disrm: bool, max_new_tokens: int) -> int:
    """Cache columns one row of ``sample`` needs (with ``LENGTH_MARGIN``): a DisRM scores the prompt with one
    answer at a time, a GRM reads every answer and writes its judgement."""
    prompt, answers = sample_tokens(sample)
    if is_disrm:
        longest = max((len(a) for a in sample.answers), default=0) / CHARS_PER_TOKEN
        return int(LENGTH_MARGIN * (prompt + longest))
    return int(LENGTH_MARGIN * (prompt + answers)) + max_new_tokens


def split_long(samples: Sequence[EvalSample], config, dtype: str, *, is_disrm: bool, max_new_tokens: int,
               device_memory: int | None, max_tokens: int | None) -> list[bool]:
    """Per sample: too long for one replica's device. ``max_tokens`` (``--replica-max-tokens``) sets the limit
    in tokens; otherwise the slot plan decides from one device's memory (nothing is too long where that is
    unknown, e.g. CPU replicas)."""
    columns = [one_device_columns(s, is_disrm=is_disrm, max_new_tokens=max_new_tokens) for s in samples]
    if max_tokens is not None:
        return [c > max_tokens for c in columns]
    if device_memory is None:
        return [False] * len(samples)
    config = config.replace(dtype=dtype)
    weights = weight_bytes(config, dtype)
    return [not plan_slots(config, weights, c, device_memory)["fits"] for c in columns]


def share_out(costs: Sequence[float], replicas: int) -> list[list[int]]:
    """Sample indices per replica: the costliest first, each to the replica with the least cost so far (longest
    processing time first); each share keeps the data's order."""
    loads = [(0.0, r) for r in range(replicas)]
    shares: list[list[int]] = [[] for _ in range(replicas)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, r = heapq.heappop(loads)
        shares[r].append(index)
        heapq.heappush(loads, (load + costs[index], r))
    return [sorted(share) for share in shares]


# ------------------------------------------------------------------------------------------------ processes
def replica_dir(save_path: str, index: int) -> str:
    return os.path.join(save_path, REPLICA_DIR, f"r{index}")


def _done_samples(directory: str) -> int:
    """Samples a replica has finished: lines of its finished task files and of its journals (headers off)."""
    partial = os.path.join(directory, "partial")
    done = 0
    try:
        names = os.listdir(partial)
    except OSError:
        return 0
    for name in names:
        if name.endswith(".jsonl") and not name.endswith(".tmp"):
            try:
                with open(os.path.join(partial, name), "rb") as handle:
                    done += max(0, sum(1 for _ in handle) - 1)
            except OSError:
                pass
    return done


def _last_error(path: str) -> str:
    """The last ``error:`` line of a replica's log (its CLI's one-line error), else its last line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = [line.strip() for line in handle if line.strip()]
    except OSError:
        return "(no log)"
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(empty log)"])[-1]


def _start(index: int, device: str, argv: list[str], log_path: str) -> subprocess.Popen:
    env = dict(os.environ)
    if device != "cpu":
        env["CUDA_VISIBLE_DEVICES"] = device  # the replica's JAX sees (and allocates on) this GPU alone
    log = open(log_path, "w", encoding="utf-8")
    try:
        return subprocess.Popen([sys.executable, "-m", "longrm_jax.evaluate", *argv], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    finally:
        log.close()  # the child holds its own descriptor


def _stop_all(procs: list[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to every running replica and wait for them (a judge journals what it finished on SIGINT)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.time() + 120
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()


def replica_config(cfg, directory: str, share: list[EvalSample]):
    """A replica's settings: the run's ``cfg`` (an ``EvalConfig``) for the samples of ``share`` alone, saved in
    ``directory``, one process, no progress bar, no verdict check (the merged run checks), and the save path's
    state as the parent found it (``--resume``, else replaced)."""
    return dataclasses.replace(cfg, save_path=directory, only_samples=[s.where for s in share], replicas="1",
                               progress=False, allow_no_verdicts=True, resume=cfg.resume, overwrite=not cfg.resume)


def run_replicas(cfg, shares: list[list[EvalSample]], devices: list[str]) -> None:
    """Start one replica per share on its device (``python -m longrm_jax.evaluate --config`` its
    :func:`replica_config`, written beside its log), show their joint progress and wait for all; the first failure
    stops the others and raises :class:`ReplicaFailed` with its log's error line. Ctrl-C (or SIGTERM) is passed on,
    so each replica journals what it finished for ``--resume``."""
    save_path, progress = cfg.resolved_save_path(), cfg.progress
    procs, logs = [], []
    for index, (share, device) in enumerate(zip(shares, devices)):
        directory = replica_dir(save_path, index)
        os.makedirs(directory, exist_ok=True)
        config_file = os.path.join(directory, "config.yaml")
        with open(config_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(replica_config(cfg, directory, share).to_dict(), handle, sort_keys=False)
        logs.append(os.path.join(directory, "evaluate.log"))
        procs.append(_start(index, device, ["--config", config_file], logs[-1]))
        logger.info("replica %d on %s: %d samples, log %s", index, "the CPU" if device == "cpu" else f"GPU {device}",
                    len(share), logs[-1])
    previous = signal.signal(signal.SIGTERM, lambda *_: (_stop_all(procs, signal.SIGTERM), sys.exit(143)))
    total = sum(len(share) for share in shares)
    try:
        with tqdm(total=total, desc="judging", unit="sample", disable=not progress) as bar:
            while any(proc.poll() is None for proc in procs):
                failed = [i for i, proc in enumerate(procs) if proc.returncode not in (None, 0)]
                if failed:
                    break
                bar.update(sum(_done_samples(replica_dir(save_path, i)) for i in range(len(procs))) - bar.n)
                time.sleep(1.0)
            bar.update(total - bar.n if all(proc.returncode == 0 for proc in procs) else 0)
    except KeyboardInterrupt:
        _stop_all(procs, signal.SIGINT)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [i for i, proc in enumerate(procs) if proc.returncode not in (None, 0)]
    if failed:
        _stop_all(procs, signal.SIGINT)
        i = failed[0]
        raise ReplicaFailed(f"replica {i} (of {len(procs)}) exited with status {procs[i].returncode} ({logs[i]}): "
                            f"{_last_error(logs[i]).removeprefix('error: ')}", procs[i].returncode)


def merged_predictions(save_path: str, samples: list[EvalSample], replicas: int) -> dict[tuple[str, int], dict]:
    """Every replica's ``predictions.jsonl`` by (file, row); each of ``samples`` must have one."""
    by_place: dict[tuple[str, int], dict] = {}
    for index in range(replicas):
        path = os.path.join(replica_dir(save_path, index), "predictions.jsonl")
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    record = json.loads(line)
                    by_place[(record["file"], record["row"])] = record
    missing = [s.where for s in samples if (s.file, s.row) not in by_place]
    if missing:
        raise ReplicaFailed(f"the replicas returned no prediction for {len(missing)} samples (first: "
                            f"{missing[0]})", 1)
    return by_place


def merged_timings(save_path: str, replicas: int) -> dict:
    """The replicas' ``timings.json`` as one: phases ran side by side, so seconds are the slowest replica's;
    token and call counts add up; the rest is replica 0's. ``per_replica`` keeps each one."""
    each = []
    for index in range(replicas):
        with open(os.path.join(replica_dir(save_path, index), "timings.json"), encoding="utf-8") as handle:
            each.append(json.load(handle))
    merged: dict = {}
    for timings in each:
        for key, value in timings.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                merged.setdefault(key, value)
            elif key.endswith("_s") or key.startswith("max_"):
                merged[key] = max(merged.get(key, value), value)
            else:
                merged[key] = merged.get(key, 0) + value
    merged["replicas"] = replicas
    merged["per_replica"] = each
    return merged


def merged_slow_paths(save_path: str, replicas: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for index in range(replicas):
        try:
            with open(os.path.join(replica_dir(save_path, index), "results.json"), encoding="utf-8") as handle:
                taken = json.load(handle).get("slow_paths") or {}
        except (OSError, ValueError):
            continue
        for key, n in taken.items():
            counts[key] = counts.get(key, 0) + n
    return counts


def judge_on_replicas(cfg, samples: list[EvalSample]
                      ) -> tuple[dict[tuple[str, int], dict], list[EvalSample], int, Timings] | None:
    """Judge ``samples`` with one process per device (:func:`plan_replicas` on ``cfg``, an ``EvalConfig``):
    (predictions by (file, row) of the samples the replicas judged, the samples too long for one device, left
    to the caller's seq mesh, the number of devices, the replicas' merged timings). None
    when the plan is one program (the caller judges every sample in this process)."""
    config = from_hf_config(read_hf_config(cfg.model_path))
    devices, reason = plan_replicas(str(cfg.replicas), cfg.mesh, config, cfg.dtype)
    logger.info("replicas: %s", reason)
    if not devices:
        return None
    long = split_long(samples, config, cfg.dtype, is_disrm=cfg.is_disrm, max_new_tokens=cfg.judgement_budget,
                      device_memory=None if devices[0] == "cpu" else gpu_memory_bytes(devices[0]),
                      max_tokens=cfg.replica_max_tokens)
    too_long = [s for s, is_long in zip(samples, long) if is_long]
    fitting = [s for s, is_long in zip(samples, long) if not is_long]
    if too_long:
        logger.info("replicas: %d of %d samples are too long for one device: judged after the replicas over a "
                    "seq mesh of %d devices", len(too_long), len(samples), len(devices))
    predictions: dict[tuple[str, int], dict] = {}
    timings = Timings()
    if fitting:
        costs = [sample_cost(s, config, is_disrm=cfg.is_disrm, both_orders=cfg.both_orders,
                             max_new_tokens=cfg.judgement_budget, share_prompt=cfg.share_prompt) for s in fitting]
        shares = [[fitting[i] for i in share] for share in share_out(costs, len(devices))]
        shares, used = zip(*[(share, d) for share, d in zip(shares, devices) if share])  # fewer samples than GPUs
        save = cfg.resolved_save_path()
        begin = time.time()
        run_replicas(cfg, list(shares), list(used))
        predictions = merged_predictions(save, fitting, len(shares))
        timings.set(**merged_timings(save, len(shares)))
        timings.set(judging_wall_s=time.time() - begin)  # processes started, run and merged
        slow_paths.add_counts(merged_slow_paths(save, len(shares)))
    return predictions, too_long, len(devices), timings
