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
import time
from dataclasses import dataclass

import jax

from longrm_jax.parallel.mesh import make_mesh
from longrm_jax.training.checkpoint import Checkpointer, completed_steps, is_training_checkpoint, saved_run_config
from longrm_jax.training.checkpoint_check import find_resume_point, restore_newest_intact
from longrm_jax.training.config import to_yaml
from longrm_jax.training.config_schema import TrainConfig
from longrm_jax.training.data_source import (count_batches, eval_batches, load_tokenizer, missing_eval_reason,
                                             train_iterator, train_records)
from longrm_jax.training.data_source import slots as data_slots
from longrm_jax.training.distributed import maybe_initialize
from longrm_jax.training.held_out import eval_step_for, pairwise_accuracy
from longrm_jax.training.host_memory import check_data_buffers
from longrm_jax.training.memory_plan import GiB, plan_train_step, predicted_host
from longrm_jax.training.mesh_plan import plan_auto_mesh
from longrm_jax.training.model_setup import codec_for, load_model, model_config
from longrm_jax.training.run_dir import (adopt_set_aside_runs, check_fresh_run_allowed, check_resume_compatible,
                                         set_aside_previous_run, trim_metrics)
from longrm_jax.training.run_lock import RunLock
from longrm_jax.training.state import abstract_state, create_state, lr_schedule, make_optimizer
from longrm_jax.training.step_groups import StepsByGroups, check_rows_split, groups_bound
from longrm_jax.training.step_loop import (  # noqa: F401 - the errors are part of this module's API (train.py)
    DegenerateDataError, Judge, NonFiniteLossError, RunResult, StepCallback, StepLoop, degenerate_message, log_line)
from longrm_jax.training.steps import StageSpec
from longrm_jax.training.telemetry import MetricsWriter


def run(cfg: TrainConfig, *, resume: bool = False, on_step: StepCallback | None = None,
        judge: Judge | None = None) -> RunResult:
    """Train per ``cfg``; with ``resume`` continue from the newest checkpoint of ``checkpoint.dir``. ``judge``
    judges saved steps when ``judge.data`` is set (``python -m longrm_jax.train`` gives the evaluator's).

    Process 0 holds ``output_dir`` for the whole run (``training.run_lock``); metrics writers are closed however
    the run ends (an open tensorboardX writer prints a traceback at interpreter exit)."""
    maybe_initialize(cfg.distributed)
    with contextlib.ExitStack() as stack:
        if jax.process_index() == 0:
            stack.enter_context(RunLock(cfg.output_dir))
        if cfg.judge.data is not None and judge is None:
            log_line("note: judge.data is set but this caller gave no judge: no held-out verdicts "
                     "(python -m longrm_jax.train judges)")
        return _run(cfg, resume, stack, on_step or (lambda step, event: None), judge)


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


def _run(cfg: TrainConfig, resume: bool, stack: contextlib.ExitStack, on_step: StepCallback,
         judge: Judge | None) -> RunResult:
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
    mcfg, codec, state, state_sh = _initial_state(cfg, inputs, tx, state_key)
    with jax.set_mesh(inputs.mesh):
        iterator = train_iterator(cfg, inputs.tokenizer, inputs.records)
        # The first batch waits for one window to be tokenized and packed.
        log_line(f"data: packing windows of {iterator.cfg.resolved_window_groups} groups"
             f"{' (auto)' if cfg.data.window_groups is None else ''}, rows of {max(iterator.buckets)} tokens")
        ckpt, state, start, aside = _restore_or_set_aside(cfg, inputs, plan, point, state, iterator)
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
            result.accuracy_before = _held_out_accuracy(cfg, eval_fn, state, inputs, writer, 0, "before")
        held_out = None
        if cfg.eval_every and inputs.eval_host:
            def held_out(state, step):
                _held_out_accuracy(cfg, eval_fn, state, inputs, writer, step, f"at step {step} of")
        loop = StepLoop(cfg, inputs, mcfg, steps_by_groups, iterator, ckpt, writer, result, on_step, aside, start,
                        judge if cfg.judge.data is not None else None, held_out)
        state, step = loop.run(state)
        result.final_step = step
        if result.degenerate_groups:
            log_line("WARNING: " + degenerate_message(cfg.data.seq_len, result.degenerate_groups, result.trained_groups,
                                                  "trained"))
        if cfg.eval_after and inputs.eval_host:
            result.accuracy_after = _held_out_accuracy(cfg, eval_fn, state, inputs, writer, step, "after")
        writer.close()
        result.state = state
    result.wall_s = time.perf_counter() - started
    result.saved_steps = completed_steps(inputs.ckpt_dir)
    return result


def _initial_state(cfg: TrainConfig, inputs: _RunInputs, tx, state_key):
    """(model config, param codec, train state, its shardings): the init weights loaded onto the mesh, or for a
    resume an abstract state the checkpoint is restored into.

    Built outside the mesh context: abstract NNX models would try to read their logical axis names as mesh axes
    under it. Every array is placed with an explicit NamedSharding instead."""
    if inputs.resumable:
        # The checkpoint holds the whole state (LoRA's frozen base too): restore into an abstract one. Loading
        # the init weights first would read them for nothing and leave the restored 8B state scattered around
        # their freed buffers (a resumed Qwen3-8B run then failed to find 48 GiB in one piece for its update).
        mcfg = model_config(cfg, inputs.tokenizer)
        codec = codec_for(mcfg)
        return (mcfg, codec, *abstract_state(cfg, codec, tx, inputs.mesh, state_key))
    mcfg, codec, values = load_model(cfg, inputs.mesh, inputs.tokenizer)
    return (mcfg, codec, *create_state(cfg, codec, values, tx, inputs.mesh, state_key))


def _restore_or_set_aside(cfg: TrainConfig, inputs: _RunInputs, plan, point, state, iterator):
    """(checkpointer, state, start step, the previous run set aside or None): a resume restores the newest
    intact checkpoint into ``state`` and the iterator; a fresh run moves the previous run aside."""
    if inputs.resumable:  # a state that does not fit is one line (ResumeMismatchError), not orbax's tree dump
        ckpt, state, data_state, start = restore_newest_intact(point, lambda: _checkpointer(cfg, inputs, plan),
                                                               state)
        iterator.set_state(data_state)
        log_line(f"resumed from {inputs.ckpt_dir} at step {start}")
        # Runs an interrupted rerun had set aside: this run replaces them as it would have.
        return ckpt, state, start, adopt_set_aside_runs(cfg.output_dir, inputs.ckpt_dir, cfg.checkpoint.overwrite)
    # Everything that could stop this run before training (memory plan, data, weights) has passed: only now does
    # the previous run make way, moved aside until this run's first checkpoint exists.
    aside = set_aside_previous_run(cfg.output_dir, inputs.ckpt_dir, inputs.has_checkpoint, cfg.checkpoint.overwrite)
    ckpt = _checkpointer(cfg, inputs, plan)
    if aside is not None:
        ckpt.reclaim = aside.release_now
    return ckpt, state, 0, aside


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
        log_line(f"checkpoint: saves are written before the next step runs: the step keeps {pinned / GiB:.1f} GiB of "
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
    eval_host = eval_batches(cfg, tokenizer) if cfg.evaluates_held_out else []
    no_eval_reason = None
    if cfg.evaluates_held_out and not eval_host:
        no_eval_reason = missing_eval_reason(cfg)
        log_line(f"note: {no_eval_reason}")
    if cfg.steps:
        total_steps = cfg.steps
    else:
        per_epoch = count_batches(cfg, tokenizer, records)
        total_steps = max(1, math.ceil(cfg.epochs * per_epoch))
        log_line(f"steps=0: training by epochs ({cfg.epochs} x {per_epoch} batches per epoch = {total_steps} steps); "
             "set steps=N for a fixed number of optimizer steps")
    if resume and not has_checkpoint:
        log_line(f"--resume: no checkpoint in {ckpt_dir}; starting from scratch")
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
        if auto.cfg.data.batch_rows != cfg.data.batch_rows and inputs.eval_host:  # a micro step's rows re-split
            inputs = dataclasses.replace(inputs, eval_host=eval_batches(auto.cfg, inputs.tokenizer))
        cfg, plan = auto.cfg, auto.plan
        inputs = dataclasses.replace(inputs, mesh=auto.mesh, seq_shards=int(auto.mesh.shape["seq"]))
        log_line("\n".join(auto.lines()))
    else:
        plan = plan_train_step(cfg, model_config(cfg, inputs.tokenizer), tx, schedule, first_spec, inputs.mesh,
                               state_key)
    log_line(plan.summary() + (f" (auto: tried {', '.join(plan.tried)})" if cfg.model.remat == "auto" else ""))
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


def _held_out_accuracy(cfg: TrainConfig, eval_fn, state, inputs: _RunInputs, writer: MetricsWriter, step: int,
                       when: str) -> float:
    accuracy = pairwise_accuracy(eval_fn, state, inputs.eval_host, inputs.mesh, inputs.seq_shards, inputs.slots)
    # A judge's held-out pairs are judgements: their log-prob comparison is named as such, beside its verdicts.
    judging = cfg.judge.data is not None
    name = "judgement_logprob_accuracy" if judging else "accuracy"
    log_line(f"held-out {'judgement log-prob accuracy' if judging else 'pairwise accuracy'} {when} training: "
             f"{100 * accuracy:.1f}%")
    writer.write(step, {name: accuracy}, prefix="eval")
    return accuracy
