"""The PyTorch peer of scripts/bench_train.py: HF transformers, SDPA, activation checkpointing per decoder layer,
torch AdamW, bf16 weights on a GPU (fp32 on the CPU), one chosen + rejected pair as a batch of 2 sequences.

- ``bench_torch``: one process, one GPU (the peer of every earlier bench_train figure).
- ``bench_torch_rank``: one rank of the peer on several GPUs (issue 40 item 7). Every rank builds the same
  random model (seed 0), wraps each decoder layer and then the root in FSDP2 ``fully_shard`` (after peft, where
  the run is LoRA), and trains its own pair (``pair_batch`` seed = rank) with the one-GPU peer's step: the
  gradients are averaged over ranks by FSDP's reduce-scatter, so one step equals one process taking every
  rank's pair at the mean loss. No MixedPrecisionPolicy: the weights are already the one-GPU peer's dtype, so
  compute, gradients and their reduce-scatter are bf16 on a GPU, as the one-GPU peer's gradients are.
- ``run_peer_ranks``: the parent side: one process per GPU (``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` /
  ``MASTER_PORT`` as torchrun sets them; NCCL on GPUs, gloo on the CPU), the first failure stops the others.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE_CONFIGS = {"simpo": "configs/qwen3_8b_grm_simpo.yaml", "bt": "configs/llama31_8b_disrm_bt.yaml",
                 "sft": "configs/qwen3_8b_grm_sft.yaml"}
TINY = {"qwen3_8b": "tiny_qwen3", "llama31_8b": "tiny_llama"}


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


def build_peer(model: str, stage: str, args, device) -> dict:
    """The peer's model on ``device`` (bf16 weights on a GPU, fp32 on the CPU; seed 0, so every rank and every
    run builds the same weights), SDPA, activation checkpointing, peft LoRA where the stage's config trains it.
    Returns net, mcfg, head, trains (label), lora_flops."""
    import torch
    import transformers

    from longrm_jax.models.config import to_hf_config
    from longrm_jax.training.config import load_config
    from longrm_jax.training.model_setup import preset_config

    preset = TINY[model] if args.smoke else model
    cfg = load_config(None, [f"model.preset={preset}"] + (["model.overrides.vocab_size=1000"] if args.smoke else []))
    head = "classifier" if stage == "bt" else "causal_lm"
    mcfg = preset_config(cfg).replace(head=head)
    if mcfg.pad_token_id is None:  # tiny presets take their ids from a tokenizer; HF pools at the last non-pad
        mcfg = mcfg.replace(pad_token_id=0)
    stage_cfg = load_config(os.path.join(REPO_ROOT, STAGE_CONFIGS[stage]), [])
    lora_cfg = None if args.full_params or stage_cfg.lora.rank <= 0 else stage_cfg.lora
    hf_cfg = transformers.AutoConfig.for_model(**to_hf_config(mcfg))
    hf_cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    cls = transformers.AutoModelForSequenceClassification if head == "classifier" else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        net = cls.from_config(hf_cfg, dtype=dtype)
    net.gradient_checkpointing_enable()
    trains, lora_flops = "all weights", None
    if lora_cfg is not None:
        net, trains, lora_flops = _peft_lora(net, lora_cfg)
    net.train()
    return {"net": net, "mcfg": mcfg, "head": head, "trains": trains, "lora_flops": lora_flops}


def make_optimizer(net):
    import torch

    return torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-6, betas=(0.9, 0.95),
                             weight_decay=0.0)


def pair_tensors(length: int, vocab: int, device, seed: int = 0):
    import torch

    host = pair_batch(length, vocab, seed)
    ids = torch.tensor(host["input_ids"].reshape(2, length), dtype=torch.long, device=device)
    mask = torch.tensor(host["loss_mask"].reshape(2, length), device=device)
    return ids, mask


def peer_loss(net, head: str, ids, mask):
    """The stage's loss of one pair (rows 0 chosen, 1 rejected): Bradley-Terry on the score, or SimPO
    (beta 2.5, gamma 0.5) on the mean log-probability of the response tokens (all-vocabulary fp32 logits)."""
    import torch

    if head == "classifier":
        r = net(input_ids=ids).logits[:, 0].float()
        return -torch.nn.functional.logsigmoid(r[0] - r[1])
    logits = net(input_ids=ids).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    m = mask[:, 1:].float()
    pi = (lp * m).sum(-1) / m.sum(-1)
    return -torch.nn.functional.logsigmoid(2.5 * (pi[0] - pi[1]) - 0.5)


def make_step(net, opt, head: str, ids, mask, on_grads=None):
    """One training step: loss, backward, clip to norm 1, AdamW. ``on_grads()`` runs between backward and clip."""
    import torch

    def step():
        loss = peer_loss(net, head, ids, mask)
        loss.backward()
        if on_grads is not None:
            on_grads()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)  # float() synchronises

    return step


def timed_steps(step, sync, args, barrier=None) -> tuple[list[float], list[float]]:
    """As the JAX runs: a first step and ``--warmup`` untimed ones, then ``--steps`` timed ones (each
    synchronised). Returns (every step's loss, the timed steps' seconds)."""
    losses = [step() for _ in range(1 + args.warmup)]
    sync()
    if barrier is not None:
        barrier()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        sync()
        times.append(time.perf_counter() - t0)
    return losses, times


def _peak_flops(torch, device) -> float | None:
    if torch.device(device).type != "cuda":
        return None
    return 989e12 if any(k in torch.cuda.get_device_name(device) for k in ("H100", "H200")) else None


def bench_torch(model: str, stage: str, length: int, args) -> dict:
    """The peer on one device (a GPU, or the CPU with ``--smoke``)."""
    import torch

    from longrm_jax.training.telemetry import step_flops

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    peer = build_peer(model, stage, args, device)
    net, mcfg, head = peer["net"], peer["mcfg"], peer["head"]
    opt = make_optimizer(net)
    ids, mask = pair_tensors(length, mcfg.vocab_size, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    losses, times = timed_steps(make_step(net, opt, head, ids, mask), sync, args)
    dt = float(np.median(times))
    flops = step_flops(mcfg, head, np.ones((2, length), np.int32), lora=peer["lora_flops"])
    peak = _peak_flops(torch, device)
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    del net, opt
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"tokens_per_s": 2 * length / dt, "tokens_per_s_per_gpu": 2 * length / dt, "step_s": dt,
            "mfu": flops / dt / peak if peak else None, "peak_gib": peak_mem, "loss": losses[-1], "losses": losses,
            "step_times": times, "trains": peer["trains"], "devices": 1,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}


def fsdp2_shard(net, mesh) -> int:
    """FSDP2 ``fully_shard`` on every decoder layer, then on the root (embeddings, final norm, head); returns the
    number of layers wrapped."""
    from torch.distributed.fsdp import fully_shard

    layers = [m for m in net.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise RuntimeError(f"no decoder layers found in {type(net).__name__} to shard")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return len(layers)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def bench_torch_rank(model: str, stage: str, length: int, args, n: int) -> dict | None:
    """One rank of the peer on ``n`` GPUs (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` /
    ``MASTER_PORT`` from the environment). Returns the node's figures on rank 0, None on the others.

    ``args.peer_dump`` (tests): rank 0 saves the first step's averaged gradients (before clipping) and every
    rank's losses there with ``torch.save``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from longrm_jax.training.telemetry import step_flops

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if world != n:
        raise RuntimeError(f"WORLD_SIZE={world} but the peer was asked for {n} GPUs")
    cuda = torch.cuda.is_available() and not args.smoke
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the ranks share the host's cores
        dist.init_process_group("gloo")
    peer = build_peer(model, stage, args, device)
    net, mcfg, head = peer["net"], peer["mcfg"], peer["head"]
    layers = fsdp2_shard(net, init_device_mesh(device.type, (world,)))
    if cuda:
        torch.cuda.empty_cache()  # the full weights each rank built before sharding are free now
    opt = make_optimizer(net)
    ids, mask = pair_tensors(length, mcfg.vocab_size, device, seed=rank)  # each rank its own pair
    grads = {}

    def on_grads():
        if not grads and getattr(args, "peer_dump", None):  # every rank takes part in the all-gathers
            grads.update({k: _full(p.grad).detach().cpu() for k, p in net.named_parameters() if p.grad is not None})

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    losses, times = timed_steps(make_step(net, opt, head, ids, mask, on_grads), sync, args, dist.barrier)
    mine = {"losses": losses, "times": times,
            "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None}
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0 and getattr(args, "peer_dump", None):
        torch.save({"grads": grads, "losses": [r["losses"] for r in every]}, args.peer_dump)
    dist.destroy_process_group()  # on success only: a failed rank exits at once (others wait in a collective)
    if rank != 0:
        return None
    step_times = [max(r["times"][i] for r in every) for i in range(len(times))]  # a step ends on its slowest rank
    dt = float(np.median(step_times))
    flops = step_flops(mcfg, head, np.ones((2, length), np.int32), lora=peer["lora_flops"])  # per rank
    peak = _peak_flops(torch, device)
    peaks = [r["peak_gib"] for r in every]
    return {"tokens_per_s": world * 2 * length / dt, "tokens_per_s_per_gpu": 2 * length / dt, "step_s": dt,
            "mfu": flops / dt / peak if peak else None, "peak_gib": None if None in peaks else max(peaks),
            "peak_gib_ranks": peaks, "loss": losses[-1], "rank_losses": [r["losses"] for r in every],
            "step_times": step_times, "devices": world,
            "trains": f"{peer['trains']}; FSDP2 over {world} GPUs ({layers} layers + root), a pair per GPU",
            "device": torch.cuda.get_device_name(device) if cuda else "cpu"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_peer_ranks(cmd: list[str], n: int, timeout: float | None = None) -> dict:
    """Start ``cmd`` (a ``--one model,stage,length,n`` child of bench_train.py) once per GPU with torchrun's
    environment variables; wait for all, stopping the others as soon as one fails. Returns rank 0's RESULT."""
    port = _free_port()
    procs, outs = [], []
    start = time.monotonic()
    try:
        for rank in range(n):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       LOCAL_RANK=str(rank), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0")
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            outs.append((out, err))
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env))
        timed_out = False
        while None in [p.poll() for p in procs]:  # a list: every child polled, each time
            if any(p.returncode not in (None, 0) for p in procs):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        for p in procs:  # our own children only: a failed or timed-out rank leaves the others in a collective
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    texts = []
    for out, err in outs:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), err.read()))
        out.close()
        err.close()
    failed = next((r for r, p in enumerate(procs) if p.returncode not in (0, -9)), None)
    if failed is None and any(p.returncode != 0 for p in procs):
        failed = next(r for r, p in enumerate(procs) if p.returncode != 0)
    order = ([failed] if failed is not None else []) + [0]  # the failing rank's own RESULT says why
    for r in order:
        lines = [l for l in texts[r][0].splitlines() if l.startswith("RESULT ")]
        if lines:
            res = json.loads(lines[-1][len("RESULT "):])
            if failed is None or "skipped" in res:
                return res
    r = failed if failed is not None else 0
    sys.stderr.write(f"[peer rank {r}]\n" + texts[r][1][-4000:])
    why = f"timed out after {timeout:.0f} s" if timed_out else f"exited {procs[r].returncode}"
    return {"skipped": f"peer rank {r} of {n} {why} (killed / out of memory?)"}
