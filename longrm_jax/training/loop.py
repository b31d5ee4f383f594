"""The training run: mesh, data, model, state, the step loop, evaluation, checkpoints and metrics.

``run`` reads as its steps: inputs (mesh, data, step count), the step's memory plan and compilation, a resume's
settings check, model and state, restore (or the previous run moved aside: training.run_dir), the run record,
held-out accuracy before, the step loop (saves, SIGINT/SIGTERM: training.interrupt), accuracy after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
from tqdm.auto import tqdm

from longrm_jax.cli_support import ExitStatus
from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.training import batches as batch_lib
from longrm_jax.training.checkpoint import Checkpointer, completed_steps, is_training_checkpoint, saved_run_config
from longrm_jax.training.checkpoint_check import find_resume_point, restore_newest_intact
from longrm_jax.training.config import to_yaml
from longrm_jax.training.config_schema import TrainConfig
from longrm_jax.training.data_source import (count_batches, degenerate_groups, eval_batches, load_tokenizer,
                                             missing_eval_reason, train_iterator, train_records)
from longrm_jax.training.data_source import slots as data_slots
from longrm_jax.training.distributed import maybe_initialize
from longrm_jax.training.host_memory import check_data_buffers
from longrm_jax.training.interrupt import StopSignals, TrainingInterrupted
from longrm_jax.training.memory_budget import peak_device_gib
from longrm_jax.training.memory_plan import GiB, plan_train_step, predicted_host
from longrm_jax.training.mesh_plan import plan_auto_mesh
from longrm_jax.training.model_setup import codec_for, load_model, model_config
from longrm_jax.training.run_dir import (SetAside, adopt_set_aside_runs, check_fresh_run_allowed,
                                         check_resume_compatible, set_aside_previous_run, trim_metrics)
from longrm_jax.training.held_out import eval_step_for, pairwise_accuracy
from longrm_jax.training.run_lock import RunLock
from longrm_jax.training.state import abstract_state, create_state, lr_schedule, make_optimizer
from longrm_jax.training.step_groups import StepsByGroups, check_rows_split, global_max_groups, groups_bound
from longrm_jax.training.steps import PREFERENCE_METRICS, StageSpec
from longrm_jax.training.telemetry import LoraFlops, MetricsWriter, StepProfiler, peak_flops, step_flops


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm became NaN / inf; the run stopped without saving that state."""

    exit_code = ExitStatus.TRAINING_STOPPED


class DegenerateDataError(RuntimeError):
    """Every preference group of the first batch has a rejected sequence identical to its chosen one."""

    exit_code = ExitStatus.TRAINING_STOPPED


@dataclass
class RunResult:
    final_step: int
    start_step: int = 0  # the step this run started from (a resume's checkpoint step)
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    last_metrics: dict = field(default_factory=dict)
    checkpoint_dir: str | None = None
    state: object = None  # the final TrainState (for tests)
    # Preference groups trained whose chosen and a rejected sequence were identical (no gradient), and all groups.
    degenerate_groups: int = 0
    trained_groups: int = 0
    no_eval_reason: str | None = None  # why no held-out accuracy was measured
    wall_s: float = 0.0  # the whole run, start-up and compilation included
    tokens: int = 0  # tokens trained by this run (padding excluded)
    train_s: float = 0.0  # seconds in its train steps, the first (which compiles) excluded
    timed_tokens: int = 0  # tokens of the steps train_s covers
    saved_steps: list = field(default_factory=list)  # complete checkpoint steps at the end

    @property
    def tokens_per_s(self) -> float | None:
        return self.timed_tokens / self.train_s if self.train_s > 0 else None


def _log(msg: str) -> None:
    if jax.process_index() == 0:
        tqdm.write(msg)


def degenerate_message(seq_len: int, degenerate: int, total: int, where: str) -> str:
    return (f"{degenerate} of {total} preference groups {where} have a rejected sequence identical to the chosen "
            f"one after truncation to data.seq_len={seq_len} tokens, so they give no gradient: raise "
            "data.seq_len (inspect the lengths with python -m longrm_jax.data.inspect_data) or check the data for "
            "identical responses")


# Called as on_step(step, event): event "trained" once step ``step``'s update is done (metrics logged), "saving"
# right after that step's checkpoint save started (asynchronous saves are still writing). Tests inject faults here.
StepCallback = Callable[[int, str], None]


def run(cfg: TrainConfig, *, resume: bool = False, on_step: StepCallback | None = None) -> RunResult:
    """Train per ``cfg``; with ``resume`` continue from the newest checkpoint of ``checkpoint.dir``.

    Process 0 holds ``output_dir`` for the whole run (``training.run_lock``); metrics writers are closed however
    the run ends (an open tensorboardX writer prints a traceback at interpreter exit)."""
    maybe_initialize(cfg.distributed)
    with contextlib.ExitStack() as stack:
        if jax.process_index() == 0:
            stack.enter_context(RunLock(cfg.output_dir))
        return _run(cfg, resume, stack, on_step or (lambda step, event: None))


@dataclass
class _RunInputs:
    """What the run trains on and for how long, decided before any model exists."""

    mesh: object
    seq_shards: int
    slots: int | None  # k sequences per group row with data.layout rows, else None
    tokenizer: object
    records: object
    eval_host: list
    no_eval_reason: str | None
    total_steps: int
    num_rejects: int
    ckpt_dir: str
    has_checkpoint: bool  # ckpt_dir holds a checkpoint (of an earlier run)
    resumable: bool  # --resume and there is a checkpoint to continue from


def _run(cfg: TrainConfig, resume: bool, stack: contextlib.ExitStack, on_step: StepCallback) -> RunResult:
    started = time.perf_counter()
    inputs = _prepare_inputs(cfg, resume)
    tx = make_optimizer(cfg.optim, inputs.total_steps)
    schedule = lr_schedule(cfg.optim, inputs.total_steps)
    state_key = jax.random.key(cfg.seed + 1)
    cfg, inputs, plan, first_spec = _plan_step(cfg, inputs, tx, schedule, state_key)
    point = None
    if inputs.resumable:  # before any weight is read or anything written: one line naming what differs, read
        # from the newest step whose files are intact (training.checkpoint_check: a corrupt one is named, skipped)
        point = find_resume_point(inputs.ckpt_dir, completed_steps(inputs.ckpt_dir), cfg.checkpoint.on_corrupt)
        saved, saved_step = saved_run_config(inputs.ckpt_dir, point.step)
        check_resume_compatible(saved, cfg.to_dict(), inputs.ckpt_dir, saved_step)

    # Built outside the mesh context: abstract NNX models would try to read their logical axis names as mesh
    # axes under it. Every array is placed with an explicit NamedSharding instead.
    if inputs.resumable:
        # The checkpoint holds the whole state (LoRA's frozen base too): restore into an abstract one. Loading
        # the init weights first would read them for nothing and leave the restored 8B state scattered around
        # their freed buffers (a resumed Qwen3-8B run then failed to find 48 GiB in one piece for its update).
        mcfg = model_config(cfg, inputs.tokenizer)
        codec = codec_for(mcfg)
        state, state_sh = abstract_state(cfg, codec, tx, inputs.mesh, state_key)
    else:
        mcfg, codec, values = load_model(cfg, inputs.mesh, inputs.tokenizer)
        state, state_sh = create_state(cfg, codec, values, tx, inputs.mesh, state_key)
        del values
    with jax.set_mesh(inputs.mesh):
        iterator = train_iterator(cfg, inputs.tokenizer, inputs.records)
        # The first batch waits for one window to be tokenized and packed.
        _log(f"data: packing windows of {iterator.cfg.resolved_window_groups} groups"
             f"{' (auto)' if cfg.data.window_groups is None else ''}, rows of {max(iterator.buckets)} tokens")
        aside = None
        if inputs.resumable:  # a state that does not fit is one line (ResumeMismatchError), not orbax's tree dump
            ckpt, state, data_state, start = restore_newest_intact(point, lambda: _checkpointer(cfg, inputs, plan),
                                                                   state)
            iterator.set_state(data_state)
            _log(f"resumed from {inputs.ckpt_dir} at step {start}")
            # Runs an interrupted rerun had set aside: this run replaces them as it would have.
            aside = adopt_set_aside_runs(cfg.output_dir, inputs.ckpt_dir, cfg.checkpoint.overwrite)
        else:
            # Everything that could stop this run before training (memory plan, data, weights) has passed: only
            # now does the previous run make way, moved aside until this run's first checkpoint exists.
            aside = set_aside_previous_run(cfg.output_dir, inputs.ckpt_dir, inputs.has_checkpoint,
                                           cfg.checkpoint.overwrite)
            ckpt = _checkpointer(cfg, inputs, plan)
            if aside is not None:
                ckpt.reclaim = aside.release_now
            start = 0
        # The run record: written once the restore succeeded (a refused resume leaves the run's record as it was).
        _write_run_record(cfg, plan)
        if start and jax.process_index() == 0:
            trim_metrics(cfg.output_dir, start)
        writer = MetricsWriter(cfg.output_dir, tensorboard=cfg.tensorboard, append=bool(start),
                               purge_step=start + 1 if start else None)
        stack.callback(writer.close)
        steps_by_groups = StepsByGroups(cfg, codec, tx, schedule, state_sh, inputs.mesh, inputs.num_rejects,
                                        inputs.slots is not None, first_spec, plan.step)
        eval_fn = eval_step_for(cfg, codec, inputs.eval_host, inputs.slots is not None)
        result = RunResult(final_step=start, start_step=start, checkpoint_dir=inputs.ckpt_dir,
                           no_eval_reason=inputs.no_eval_reason)
        if cfg.eval_before and start == 0 and inputs.eval_host:
            result.accuracy_before = _held_out_accuracy(eval_fn, state, inputs, writer, 0, "before")
        state, step = _train_steps(cfg, inputs, mcfg, state, start, steps_by_groups, iterator, ckpt, writer,
                                   result, on_step, aside)
        result.final_step = step
        if result.degenerate_groups:
            _log("WARNING: " + degenerate_message(cfg.data.seq_len, result.degenerate_groups, result.trained_groups,
                                                  "trained"))
        if cfg.eval_after and inputs.eval_host:
            result.accuracy_after = _held_out_accuracy(eval_fn, state, inputs, writer, step, "after")
        writer.close()
        result.state = state
    result.wall_s = time.perf_counter() - started
    result.saved_steps = completed_steps(inputs.ckpt_dir)
    return result


def _checkpointer(cfg: TrainConfig, inputs: _RunInputs, plan) -> Checkpointer:
    return Checkpointer(inputs.ckpt_dir, keep=cfg.checkpoint.keep, async_save=_async_save(cfg, plan),
                        on_low_disk=cfg.checkpoint.on_low_disk, save_host_gb=cfg.checkpoint.save_host_gb)


def _async_save(cfg: TrainConfig, plan) -> bool:
    """``checkpoint.async_save``, or where it is null: asynchronous unless the step keeps pinned host memory. An
    asynchronous save copies the whole state to host memory and writes it while the next steps run, so the copy
    and the step's pinned buffers (which cannot be swapped) are in the host's RAM at once."""
    if cfg.checkpoint.async_save is not None:
        return cfg.checkpoint.async_save
    pinned = predicted_host(plan.programs)
    if pinned and (cfg.checkpoint.every or cfg.checkpoint.at_end):
        _log(f"checkpoint: saves are written before the next step runs: the step keeps {pinned / GiB:.1f} GiB of "
             "pinned host memory per device, beside which an asynchronous save's host copy of the state may not fit "
             "(checkpoint.async_save=true to overlap them)")
    return not pinned


def _prepare_inputs(cfg: TrainConfig, resume: bool) -> _RunInputs:
    """The mesh, tokenizer, training records, held-out batches, step count. A fresh run into an earlier run's
    checkpoints without checkpoint.overwrite is refused here, before anything expensive (nothing is moved or
    deleted yet: run_dir)."""
    ckpt_dir = cfg.checkpoint.dir or os.path.join(cfg.output_dir, "checkpoints")
    has_checkpoint = is_training_checkpoint(ckpt_dir)
    if not resume:  # a refused run should stop in seconds
        check_fresh_run_allowed(ckpt_dir, cfg.checkpoint.overwrite, has_checkpoint)
    m = cfg.mesh
    sizes = (m.data, m.fsdp, m.seq, m.tensor)
    devices = jax.devices()
    if -1 not in sizes and jax.process_count() == 1 and math.prod(sizes) < len(devices):
        devices = devices[: math.prod(sizes)]  # a fixed-size mesh on a larger host uses its first devices
    mesh = None  # mesh: auto is chosen with the step's memory plan (_plan_step)
    if not m.auto:
        mesh = make_mesh(data=m.data, fsdp=m.fsdp, seq=m.seq, tensor=m.tensor, devices=devices)
        check_rows_split(cfg, mesh)
    check_data_buffers(cfg)  # before any batch is packed: one too large for the RAM ended in the OOM killer
    tokenizer = load_tokenizer(cfg.data)
    records = train_records(cfg)
    eval_host = eval_batches(cfg, tokenizer) if (cfg.eval_before or cfg.eval_after) else []
    no_eval_reason = None
    if (cfg.eval_before or cfg.eval_after) and not eval_host:
        no_eval_reason = missing_eval_reason(cfg)
        _log(f"note: {no_eval_reason}")
    if cfg.steps:
        total_steps = cfg.steps
    else:
        per_epoch = count_batches(cfg, tokenizer, records)
        total_steps = max(1, math.ceil(cfg.epochs * per_epoch))
        _log(f"steps=0: training by epochs ({cfg.epochs} x {per_epoch} batches per epoch = {total_steps} steps); "
             "set steps=N for a fixed number of optimizer steps")
    if resume and not has_checkpoint:
        _log(f"--resume: no checkpoint in {ckpt_dir}; starting from scratch")
    return _RunInputs(mesh=mesh, seq_shards=int(mesh.shape["seq"]) if mesh else 1, slots=data_slots(cfg),
                      tokenizer=tokenizer, records=records, eval_host=eval_host, no_eval_reason=no_eval_reason,
                      total_steps=total_steps,
                      num_rejects=0 if cfg.stage == "sft" else cfg.data.num_rejects, ckpt_dir=ckpt_dir,
                      has_checkpoint=has_checkpoint, resumable=resume and has_checkpoint)


def _plan_step(cfg: TrainConfig, inputs: _RunInputs, tx, schedule, state_key):
    """(cfg with remat resolved, inputs, the compiled step's plan, its StageSpec). The step is compiled before
    any weights are loaded: a step that cannot fit stops here, in seconds, with the predicted memory and what to
    change (training.memory_plan); remat "auto" and mesh "auto" (cfg's mesh and inputs.mesh) are resolved here."""
    first_spec = StageSpec(cfg.stage, inputs.num_rejects, groups_bound(cfg, 1), inputs.slots is not None)
    if cfg.mesh.auto:  # the mesh that fits and moves the fewest bytes per step (training.mesh_plan)
        auto = plan_auto_mesh(cfg, model_config(cfg, inputs.tokenizer), tx, schedule, first_spec, jax.devices(),
                              state_key)
        cfg, plan = auto.cfg, auto.plan
        inputs = dataclasses.replace(inputs, mesh=auto.mesh, seq_shards=int(auto.mesh.shape["seq"]))
        _log("\n".join(auto.lines()))
    else:
        plan = plan_train_step(cfg, model_config(cfg, inputs.tokenizer), tx, schedule, first_spec, inputs.mesh,
                               state_key)
    _log(plan.summary() + (f" (auto: tried {', '.join(plan.tried)})" if cfg.model.remat == "auto" else ""))
    chosen = (plan.remat, plan.mlp_chunk_tokens, plan.offloaded_layers)
    if (cfg.model.remat, cfg.model.mlp_chunk_tokens, cfg.model.offloaded_layers) != chosen:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=plan.remat,
                                                                 mlp_chunk_tokens=plan.mlp_chunk_tokens,
                                                                 offloaded_layers=plan.offloaded_layers))
    return cfg, inputs, plan, first_spec


def _write_run_record(cfg: TrainConfig, plan) -> None:
    """The resolved config and the memory plan next to the run's metrics (process 0)."""
    if jax.process_index() != 0:
        return
    os.makedirs(cfg.output_dir, exist_ok=True)
    with open(os.path.join(cfg.output_dir, "config.yaml"), "w") as f:
        f.write(to_yaml(cfg))
    plan.write(os.path.join(cfg.output_dir, "memory_plan.json"))


def _held_out_accuracy(eval_fn, state, inputs: _RunInputs, writer: MetricsWriter, step: int, when: str) -> float:
    accuracy = pairwise_accuracy(eval_fn, state, inputs.eval_host, inputs.mesh, inputs.seq_shards, inputs.slots)
    _log(f"held-out pairwise accuracy {when} training: {100 * accuracy:.1f}%")
    writer.write(step, {"accuracy": accuracy}, prefix="eval")
    return accuracy


def _train_steps(cfg: TrainConfig, inputs: _RunInputs, mcfg, state, start: int, steps_by_groups: StepsByGroups,
                 iterator, ckpt: Checkpointer, writer: MetricsWriter, result: RunResult, on_step: StepCallback,
                 aside: SetAside | None = None):
    """The step loop from ``start`` to ``total_steps``: batches, updates, metrics, periodic and final saves.
    Returns (final state, steps done); the iterator and checkpointer are closed however it ends. SIGINT/SIGTERM
    end it after the step in flight with a checkpoint of that step (training.interrupt)."""
    total_steps, num_rejects = inputs.total_steps, inputs.num_rejects
    peak = peak_flops(list(inputs.mesh.devices.flat))
    lora = LoraFlops.of(state.params) if state.frozen else None  # a frozen base: no weight gradients to count
    last_saved = regular_saved = start  # regular: saved by checkpoint.every or at the end, not by an interrupt
    show_bar = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    bar = tqdm(total=total_steps, initial=start, desc=f"train {cfg.stage}", dynamic_ncols=True,
               disable=not show_bar or jax.process_index() != 0)
    step = start
    profiler = StepProfiler(cfg.profile.start, cfg.profile.steps,
                            cfg.profile.dir or os.path.join(cfg.output_dir, "profile"))
    signals = StopSignals(announce=_log)
    try:
        with signals:
            while step < total_steps:
                state, step = _one_step(cfg, inputs, mcfg, state, step, start, steps_by_groups, iterator, ckpt,
                                        result, peak, profiler, lora)
                metrics = result.last_metrics
                if step % cfg.log_every == 0 or step == total_steps:
                    writer.write(step, metrics)
                    if not show_bar:  # no bar: a line per logged step instead
                        _log(_step_line(step, total_steps, metrics))
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
                on_step(step, "trained")
                stop = signals.agreed()
                scheduled = bool(cfg.checkpoint.every) and step % cfg.checkpoint.every == 0
                if scheduled or (stop and step != last_saved):
                    _save(ckpt, step, state, iterator, cfg, mcfg)
                    last_saved = step
                    regular_saved = step if scheduled else regular_saved
                    on_step(step, "saving")
                # The previous run makes way for a checkpoint of this run's schedule, never for an interrupt's:
                # a rerun stopped by Ctrl-C at step 2 has replaced nothing a finished run made.
                if aside is not None and jax.process_index() == 0:
                    aside.release_if_replaced(regular_saved > start and ckpt.is_complete(regular_saved))
                if stop:
                    ckpt.wait()
                    if aside is not None and jax.process_index() == 0:
                        aside.release_if_replaced(regular_saved > start)
                        aside.say_kept()
                    raise TrainingInterrupted(stop, step, total_steps, inputs.ckpt_dir, saved=last_saved == step)
        if last_saved != step and cfg.checkpoint.at_end:
            _save(ckpt, step, state, iterator, cfg, mcfg)
            last_saved = step
        ckpt.wait()
        if aside is not None and jax.process_index() == 0:  # a run that saves no checkpoint replaces by finishing
            aside.release_if_replaced(True, "this run has finished" if last_saved == start else
                                      "this run's first checkpoint is complete")
    finally:
        profiler.close()
        bar.close()
        ckpt.close()
        iterator.close()
        if step < total_steps:  # stopped by an error: flush what was logged
            writer.close()
    return state, step


def _one_step(cfg: TrainConfig, inputs: _RunInputs, mcfg, state, step: int, start: int,
              steps_by_groups: StepsByGroups, iterator, ckpt: Checkpointer, result: RunResult, peak, profiler,
              lora: LoraFlops | None = None):
    """Train step ``step + 1``: its batch, the update, the finite-loss check; metrics into ``result``."""
    host = next(iterator)  # this process's rows of the global batch
    if inputs.num_rejects:
        bad, groups = degenerate_groups(host, 1 + inputs.num_rejects)
        if step == start and groups and bad == groups:
            raise DegenerateDataError(degenerate_message(cfg.data.seq_len, bad, groups, "of the first batch"))
        result.degenerate_groups += bad
        result.trained_groups += groups
    step_fn = steps_by_groups(global_max_groups(host))
    batch = batch_lib.to_global(batch_lib.prepare(host, seq_shards=inputs.seq_shards, slots=inputs.slots),
                                inputs.mesh)
    profiler.before(step + 1)
    t0 = time.perf_counter()
    state, metrics = step_fn(state, batch)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    dt = time.perf_counter() - t0
    step += 1
    profiler.after(step)
    if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
        ckpt.wait()
        good = ckpt.latest_step()
        raise NonFiniteLossError(
            f"non-finite loss ({metrics['loss']}) or gradient norm ({metrics['grad_norm']}) at step "
            f"{step}; stopping without saving it. Last good checkpoint: "
            f"{'step ' + str(good) + ' in ' + inputs.ckpt_dir if good is not None else 'none'}")
    tokens = int(metrics["tokens"])
    result.tokens += tokens
    if step > start + 1:  # the run's first step includes its compilation
        result.train_s += dt
        result.timed_tokens += tokens
    result.last_metrics = _throughput(metrics, mcfg, cfg.head, host, inputs, dt, peak, lora)
    if cfg.stage == "sft":  # no chosen / rejected pair: the step returns zeros for the preference metrics
        for key in PREFERENCE_METRICS:
            result.last_metrics.pop(key, None)
    return state, step


def _save(ckpt: Checkpointer, step: int, state, iterator, cfg: TrainConfig, mcfg) -> None:
    """Start the save of ``step`` and say how long training waited for it: the whole write when saves are
    synchronous, the copy of the state to host memory when they are not."""
    started = time.perf_counter()
    ckpt.save(step, state, iterator.get_state(), cfg.to_dict(), mcfg)
    waited = time.perf_counter() - started
    _log(f"checkpoint step {step}: " + (f"written in {waited:.1f} s" if not ckpt.async_save else
                                        f"training waited {waited:.1f} s, the write goes on in the background"))


def _step_line(step: int, total_steps: int, metrics: dict) -> str:
    """A console line for a logged step when no progress bar is shown (``progress: false``)."""
    parts = [f"step {step}/{total_steps}", f"loss {metrics['loss']:.4f}"]
    for key, fmt in (("accuracy", "{:.3f}"), ("grad_norm", "{:.3g}"), ("lr", "{:.3g}"), ("tokens_per_s", "{:.0f}"),
                     ("step_s", "{:.3f}")):
        if metrics.get(key) is not None:
            parts.append(f"{key} {fmt.format(metrics[key])}")
    return "  ".join(parts)


def _throughput(metrics: dict, mcfg, head: str, host: dict, inputs: _RunInputs, dt: float, peak,
                lora: LoraFlops | None = None) -> dict:
    """The step's metrics with tokens/s, step time, MFU and peak device memory in place of its token counts."""
    tokens = metrics.pop("tokens")
    metrics.pop("count")
    # The LM head runs on the trained tokens only, unless tokens are sharded over seq (steps.py).
    head_tokens = None if inputs.seq_shards > 1 else int((host["loss_mask"] > 0).sum())
    flops = step_flops(mcfg, head, host["segment_ids"], head_tokens=head_tokens, lora=lora) * jax.process_count()
    metrics["tokens_per_s"] = tokens / dt
    metrics["step_s"] = dt
    metrics["mfu"] = flops / dt / peak if peak else None
    metrics["peak_gib"] = peak_device_gib(inputs.mesh)
    return metrics
