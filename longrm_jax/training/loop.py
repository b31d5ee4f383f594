"""The training run: mesh, data, model, state, the step loop, evaluation, checkpoints and metrics."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field

import jax
import numpy as np
from tqdm.auto import tqdm

from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.training import batches as batch_lib
from longrm_jax.training.checkpoint import Checkpointer, is_training_checkpoint
from longrm_jax.training.config import TrainConfig
from longrm_jax.training.data_source import (count_batches, degenerate_groups, eval_batches, load_tokenizer,
                                             train_iterator, train_records)
from longrm_jax.training.data_source import slots as data_slots
from longrm_jax.training.distributed import maybe_initialize
from longrm_jax.training.telemetry import MetricsWriter, peak_flops, step_flops
from longrm_jax.training.memory_plan import peak_device_gib, plan_train_step
from longrm_jax.training.model_setup import load_model, model_config
from longrm_jax.training.run_lock import RunLock
from longrm_jax.training.state import create_state, lr_schedule, make_optimizer
from longrm_jax.training.steps import StageSpec, jit_train_step, make_eval_step, make_train_step


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN / inf; the run stopped without saving that state."""


class DegenerateDataError(RuntimeError):
    """Every preference group of the first batch has a rejected sequence identical to its chosen one."""


@dataclass
class RunResult:
    final_step: int
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    last_metrics: dict = field(default_factory=dict)
    checkpoint_dir: str | None = None
    state: object = None  # the final TrainState (for tests)
    # Preference groups trained whose chosen and a rejected sequence were identical (no gradient), and all groups.
    degenerate_groups: int = 0
    trained_groups: int = 0
    no_eval_reason: str | None = None  # why no held-out accuracy was measured


def _log(msg: str) -> None:
    if jax.process_index() == 0:
        tqdm.write(msg)


def evaluate(eval_fn, state, eval_host: list[dict], mesh, seq_shards: int,
             slots: int | None = None) -> float | None:
    """Pairwise accuracy (chosen reward > mean rejected reward) over held-out batches."""
    if not eval_host:
        return None
    correct = total = 0.0
    for host in eval_host:
        batch = batch_lib.to_global(
            batch_lib.prepare(batch_lib.process_rows(host), seq_shards=seq_shards, slots=slots), mesh)
        chosen, rejected, valid = jax.device_get(eval_fn(state.params, state.frozen, batch))
        correct += float(((chosen > rejected) & valid).sum())
        total += float(valid.sum())
    return correct / max(total, 1.0)


def _groups_bound(cfg: TrainConfig, observed: int) -> int:
    """Static number of groups per row the step is compiled for: ``data.max_groups_per_row`` or, when a row
    holds more, the next power of two (one more compilation); 1 for ``data.layout: rows``."""
    if cfg.data.layout == "rows":
        return 1
    bound = max(cfg.data.max_groups_per_row, 1)
    while bound < observed:
        bound *= 2
    return bound


def _global_max_groups(host: dict) -> int:
    """Largest groups-per-row over every process's rows (all processes must compile the same step)."""
    local = int(np.max(host["num_groups"])) if host["num_groups"].size else 0
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.int32(local))))


def _test_hook(name: str, step: int) -> bool:
    """Fault injection for tests: env LONGRM_TEST_<NAME>=<step>."""
    value = os.environ.get(f"LONGRM_TEST_{name}")
    return value is not None and int(value) == step


def degenerate_message(cfg: TrainConfig, degenerate: int, total: int, where: str) -> str:
    return (f"{degenerate} of {total} preference groups {where} have a rejected sequence identical to the chosen "
            f"one after truncation to data.seq_len={cfg.data.seq_len} tokens, so they give no gradient: raise "
            "data.seq_len (inspect the lengths with python -m longrm_jax.data.inspect_data) or check the data for "
            "identical responses")


def run(cfg: TrainConfig, *, resume: bool = False) -> RunResult:
    """Train per ``cfg``; with ``resume`` continue from the newest checkpoint of ``checkpoint.dir``.

    Process 0 holds ``output_dir`` for the whole run (``training.run_lock``); metrics writers are closed however
    the run ends (an open tensorboardX writer prints a traceback at interpreter exit)."""
    maybe_initialize(cfg.distributed)
    with contextlib.ExitStack() as stack:
        if jax.process_index() == 0:
            stack.enter_context(RunLock(cfg.output_dir))
        return _run(cfg, resume, stack)


def _run(cfg: TrainConfig, resume: bool, stack: contextlib.ExitStack) -> RunResult:
    m = cfg.mesh
    sizes = (m.data, m.fsdp, m.seq, m.tensor)
    devices = jax.devices()
    if -1 not in sizes and jax.process_count() == 1 and math.prod(sizes) < len(devices):
        devices = devices[: math.prod(sizes)]  # a fixed-size mesh on a larger host uses its first devices
    mesh = make_mesh(data=m.data, fsdp=m.fsdp, seq=m.seq, tensor=m.tensor, devices=devices)
    seq_shards = int(mesh.shape["seq"])
    slots = data_slots(cfg)  # k sequences per group row with data.layout rows, else None
    slotted = slots is not None
    tokenizer = load_tokenizer(cfg)
    records = train_records(cfg)
    eval_host = eval_batches(cfg, tokenizer) if (cfg.eval_before or cfg.eval_after) else []
    no_eval_reason = None
    if (cfg.eval_before or cfg.eval_after) and not eval_host:
        no_eval_reason = (f"no held-out pairs: data.source {cfg.data.source} has no held-out split and "
                          "data.eval_source is unset (set it to a held-out file to measure pairwise accuracy)")
        _log(f"note: {no_eval_reason}")
    if cfg.steps:
        total_steps = cfg.steps
    else:
        per_epoch = count_batches(cfg, tokenizer, records)
        total_steps = max(1, math.ceil(cfg.epochs * per_epoch))
        _log(f"{per_epoch} batches per epoch -> {total_steps} steps for {cfg.epochs} epoch(s)")
    num_rejects = 0 if cfg.stage == "sft" else cfg.data.num_rejects
    ckpt_dir = cfg.checkpoint.dir or os.path.join(cfg.output_dir, "checkpoints")
    if not resume and is_training_checkpoint(ckpt_dir):
        if not cfg.checkpoint.overwrite:
            raise FileExistsError(f"{ckpt_dir} already holds checkpoints of an earlier run: pass --resume to "
                                  "continue it, --set checkpoint.overwrite=true to replace it, or another output_dir")
        if jax.process_index() == 0:
            shutil.rmtree(ckpt_dir)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("longrm_checkpoint_dir_cleared")
    tx = make_optimizer(cfg, total_steps)
    schedule = lr_schedule(cfg, total_steps)
    state_key = jax.random.key(cfg.seed + 1)
    # Compile the step before loading any weights: a step that cannot fit stops here, in seconds, with the
    # predicted memory and what to change (training.memory_plan); remat "auto" is resolved here.
    first_spec = StageSpec(cfg.stage, num_rejects, _groups_bound(cfg, 1), slotted)
    plan = plan_train_step(cfg, model_config(cfg, tokenizer), tx, schedule, first_spec, mesh, state_key)
    _log(plan.summary() + (f" (auto: tried {', '.join(plan.tried)})" if cfg.model.remat == "auto" else ""))
    if cfg.model.remat != plan.remat:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=plan.remat))
    writer = MetricsWriter(cfg.output_dir, tensorboard=cfg.tensorboard, append=resume)
    stack.callback(writer.close)
    if jax.process_index() == 0:
        from longrm_jax.training.config import to_yaml

        os.makedirs(cfg.output_dir, exist_ok=True)
        with open(os.path.join(cfg.output_dir, "config.yaml"), "w") as f:
            f.write(to_yaml(cfg))
        plan.write(os.path.join(cfg.output_dir, "memory_plan.json"))

    # Built outside the mesh context: abstract NNX models would try to read their logical axis names as mesh
    # axes under it. Every array is placed with an explicit NamedSharding instead.
    mcfg, codec, values = load_model(cfg, mesh, tokenizer)
    state, state_sh = create_state(cfg, codec, values, tx, mesh, state_key)
    del values
    with jax.set_mesh(mesh):
        ckpt = Checkpointer(ckpt_dir, keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save)
        iterator = train_iterator(cfg, tokenizer, records)
        start = 0
        if resume and ckpt.latest_step() is not None:
            state, data_state, start = ckpt.restore(state)
            iterator.set_state(data_state)
            _log(f"resumed from {ckpt_dir} at step {start}")
        elif resume:
            _log(f"--resume: no checkpoint in {ckpt_dir}; starting from scratch")

        step_fns: dict[int, object] = {first_spec.max_groups: plan.step}

        def step_for(groups: int):
            """The jitted step compiled for ``groups`` groups per row (a static shape of the reductions)."""
            bound = _groups_bound(cfg, groups)
            if bound not in step_fns:
                spec = StageSpec(cfg.stage, num_rejects, bound, slotted)
                step_fns[bound] = jit_train_step(make_train_step(cfg, codec, tx, spec, schedule), state_sh,
                                                 batch_lib.batch_shardings(mesh, slotted=slotted))
            return step_fns[bound]

        eval_groups = max([int(np.max(b["num_groups"])) for b in eval_host] + [1])
        eval_fn = make_eval_step(cfg, codec, StageSpec(cfg.stage, cfg.data.num_rejects,
                                                       _groups_bound(cfg, eval_groups), slotted))
        result = RunResult(final_step=start, checkpoint_dir=ckpt_dir, no_eval_reason=no_eval_reason)
        if cfg.eval_before and start == 0 and eval_host:
            result.accuracy_before = evaluate(eval_fn, state, eval_host, mesh, seq_shards, slots)
            _log(f"held-out pairwise accuracy before training: {100 * result.accuracy_before:.1f}%")
            writer.write(0, {"accuracy": result.accuracy_before}, prefix="eval")

        peak = peak_flops(list(mesh.devices.flat))
        last_saved = start
        bar = tqdm(total=total_steps, initial=start, desc=f"train {cfg.stage}", dynamic_ncols=True,
                   disable=not cfg.progress or jax.process_index() != 0)
        step = start
        try:
            while step < total_steps:
                host = next(iterator)  # this process's rows of the global batch
                if num_rejects:
                    bad, groups = degenerate_groups(host, 1 + num_rejects)
                    if step == start and groups and bad == groups:
                        raise DegenerateDataError(degenerate_message(cfg, bad, groups, "of the first batch"))
                    result.degenerate_groups += bad
                    result.trained_groups += groups
                step_fn = step_for(_global_max_groups(host))
                batch = batch_lib.to_global(batch_lib.prepare(host, seq_shards=seq_shards, slots=slots), mesh)
                t0 = time.perf_counter()
                state, metrics = step_fn(state, batch)
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                dt = time.perf_counter() - t0
                step += 1
                if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
                    ckpt.wait()
                    good = ckpt.latest_step()
                    raise NonFiniteLossError(
                        f"non-finite loss ({metrics['loss']}) or gradient norm ({metrics['grad_norm']}) at step "
                        f"{step}; stopping without saving it. Last good checkpoint: "
                        f"{'step ' + str(good) + ' in ' + ckpt_dir if good is not None else 'none'}")
                tokens = metrics.pop("tokens")
                metrics.pop("count")
                # The LM head runs on the trained tokens only, unless tokens are sharded over seq (steps.py).
                head_tokens = None if seq_shards > 1 else int((host["loss_mask"] > 0).sum())
                flops = step_flops(mcfg, cfg.head, host["segment_ids"], head_tokens=head_tokens) * jax.process_count()
                metrics["tokens_per_s"] = tokens / dt
                metrics["step_s"] = dt
                metrics["mfu"] = flops / dt / peak if peak else None
                metrics["peak_gib"] = peak_device_gib(mesh)
                result.last_metrics = metrics
                if step % cfg.log_every == 0 or step == total_steps:
                    writer.write(step, metrics)
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
                if _test_hook("KILL_AT_STEP", step):
                    os.kill(os.getpid(), signal.SIGKILL)
                if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
                    ckpt.save(step, state, iterator.get_state(), cfg.to_dict(), mcfg)
                    last_saved = step
                    if _test_hook("KILL_DURING_SAVE", step):
                        os.kill(os.getpid(), signal.SIGKILL)
            if last_saved != step and cfg.checkpoint.at_end:
                ckpt.save(step, state, iterator.get_state(), cfg.to_dict(), mcfg)
        finally:
            bar.close()
            ckpt.close()
            iterator.close()
            if step < total_steps:  # stopped by an error: flush what was logged
                writer.close()
        result.final_step = step
        if result.degenerate_groups:
            _log("WARNING: " + degenerate_message(cfg, result.degenerate_groups, result.trained_groups,
                                                  "trained"))
        if cfg.eval_after and eval_host:
            result.accuracy_after = evaluate(eval_fn, state, eval_host, mesh, seq_shards, slots)
            _log(f"held-out pairwise accuracy after training: {100 * result.accuracy_after:.1f}%")
            writer.write(step, {"accuracy": result.accuracy_after}, prefix="eval")
        writer.close()
        result.state = state
    return result
