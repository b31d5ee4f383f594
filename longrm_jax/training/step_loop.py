"""The step loop of a training run (``training.loop``): batches, updates, metrics and, after each step, its
periodic actions (log, save, the interrupt check); what a run returns and the errors that stop it."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from longrm_jax.cli_support import ExitStatus
from longrm_jax.training import batches as batch_lib
from longrm_jax.training.checkpoint import Checkpointer
from longrm_jax.training.config_schema import TrainConfig
from longrm_jax.training.data_source import degenerate_groups
from longrm_jax.training.interrupt import StopSignals, TrainingInterrupted
from longrm_jax.training.memory_budget import peak_device_gib
from longrm_jax.training.run_dir import SetAside
from longrm_jax.training.step_groups import StepsByGroups, global_max_groups
from longrm_jax.training.steps import PREFERENCE_METRICS
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
    judged: dict = field(default_factory=dict)  # held-out judging: step -> its JUDGE_FIGURES (judge.data)

    @property
    def tokens_per_s(self) -> float | None:
        return self.timed_tokens / self.train_s if self.train_s > 0 else None


def log_line(msg: str) -> None:
    if jax.process_index() == 0:
        tqdm.write(msg)


def degenerate_message(seq_len: int, degenerate: int, total: int, where: str) -> str:
    return (f"{degenerate} of {total} preference groups {where} have a rejected sequence identical to the chosen "
            f"one after truncation to data.seq_len={seq_len} tokens, so they give no gradient: raise "
            "data.seq_len (inspect the lengths with python -m longrm_jax.data.inspect_data) or check the data for "
            "identical responses")


# Held-out judging of a saved step (``judge.data``): judge(checkpoint_dir, step) -> the figures of JUDGE_FIGURES,
# called on process 0 once the step's checkpoint is complete. The CLI supplies it (longrm_jax.held_out_judge): the
# evaluator is a sibling of this package.
Judge = Callable[[str, int], dict]
JUDGE_FIGURES = ("verdict_accuracy", "agreement", "unparsable", "judgements", "seconds")

# Called as on_step(step, event): event "trained" once step ``step``'s update is done (metrics logged), "saving"
# right after that step's checkpoint save started (asynchronous saves are still writing). Tests inject faults here.
StepCallback = Callable[[int, str], None]


@dataclass
class StepLoop:
    """The step loop from ``start`` to ``inputs.total_steps`` and what its steps share: batches, updates, metrics,
    and after each step its periodic actions (log every ``log_every``, save every ``checkpoint.every``, the
    SIGINT/SIGTERM check every step), then the final save. SIGINT/SIGTERM end it after the step in flight with
    a checkpoint of that step (training.interrupt)."""

    cfg: TrainConfig
    inputs: object  # training.loop's _RunInputs: mesh, seq_shards, slots, num_rejects, total_steps, ckpt_dir
    mcfg: object
    steps_by_groups: StepsByGroups
    iterator: object
    ckpt: Checkpointer
    writer: MetricsWriter
    result: RunResult
    on_step: StepCallback
    aside: SetAside | None
    start: int
    judge: Judge | None = None
    held_out: Callable[[object, int], None] | None = None  # held-out evaluation of (state, step), every eval_every

    def run(self, state):
        """(final state, steps done); the iterator and checkpointer are closed however it ends."""
        cfg, total_steps = self.cfg, self.inputs.total_steps
        self.peak = peak_flops(list(self.inputs.mesh.devices.flat))
        if self.peak and cfg.model.matmul_dtype != "compute":
            log_line(f"model.matmul_dtype={cfg.model.matmul_dtype}: mfu is bf16-equivalent (the step's FLOPs "
                     "against the bf16 peak)")
        self.lora = LoraFlops.of(state.params) if state.frozen else None  # a frozen base: no weight gradients
        self.last_saved = self.regular_saved = self.start  # regular: by checkpoint.every or at the end
        self.show_bar = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
        self.bar = tqdm(total=total_steps, initial=self.start, desc=f"train {cfg.stage}", dynamic_ncols=True,
                        disable=not self.show_bar or jax.process_index() != 0)
        self.profiler = StepProfiler(cfg.profile.start, cfg.profile.steps,
                                     cfg.profile.dir or os.path.join(cfg.output_dir, "profile"))
        step, signals = self.start, StopSignals(announce=log_line)
        try:
            with signals:
                while step < total_steps:
                    state, step = self._one_step(state, step)
                    self._after_step(state, step, signals)
            self._finish(state, step)
        finally:
            self.profiler.close()
            self.bar.close()
            self.ckpt.close()
            self.iterator.close()
            if step < total_steps:  # stopped by an error: flush what was logged
                self.writer.close()
        return state, step

    def _after_step(self, state, step: int, signals: StopSignals) -> None:
        """The periodic actions after step ``step``."""
        cfg, metrics, total_steps = self.cfg, self.result.last_metrics, self.inputs.total_steps
        if step % cfg.log_every == 0 or step == total_steps:
            self.writer.write(step, metrics)
            if not self.show_bar:  # no bar: a line per logged step instead
                log_line(_step_line(step, total_steps, metrics))
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
        self.on_step(step, "trained")
        stop = signals.agreed()  # the signal all processes agreed on, if any
        scheduled = bool(cfg.checkpoint.every) and step % cfg.checkpoint.every == 0
        if scheduled or (stop and step != self.last_saved):
            self._save(step, state)
            self.regular_saved = step if scheduled else self.regular_saved
            self.on_step(step, "saving")
        if scheduled and cfg.judge.every and step % cfg.judge.every == 0 and step < total_steps:
            self._judge(step)
        if self.held_out is not None and step % cfg.eval_every == 0 and step < total_steps:
            self.held_out(state, step)
        # The previous run makes way for a checkpoint of this run's schedule, never for an interrupt's: a rerun
        # stopped by Ctrl-C at step 2 has replaced nothing a finished run made.
        if self.aside is not None and jax.process_index() == 0:
            replaced = self.regular_saved > self.start and self.ckpt.is_complete(self.regular_saved)
            self.aside.release_if_replaced(replaced)
        if stop:
            self.ckpt.wait()
            if self.aside is not None and jax.process_index() == 0:
                self.aside.release_if_replaced(self.regular_saved > self.start)
                self.aside.say_kept()
            raise TrainingInterrupted(stop, step, total_steps, self.inputs.ckpt_dir, saved=self.last_saved == step)

    def _finish(self, state, step: int) -> None:
        """The final save (``checkpoint.at_end``), waiting for every save, and the previous run's release."""
        if self.last_saved != step and self.cfg.checkpoint.at_end:
            self._save(step, state)
        self.ckpt.wait()
        if step not in self.result.judged:
            self._judge(step)
        if self.aside is not None and jax.process_index() == 0:  # a run that saves no checkpoint replaces by finishing
            self.aside.release_if_replaced(True, "this run has finished" if self.last_saved == self.start else
                                           "this run's first checkpoint is complete")

    def _judge(self, step: int) -> None:
        """Judge the saved step ``step`` (process 0; the others wait for its figures), log and record them."""
        if self.judge is None:
            return
        self.ckpt.wait()  # the judge reads the complete checkpoint
        figures = None
        if jax.process_index() == 0:
            with jax.set_mesh(None):  # the evaluator places its model itself, outside the training mesh
                figures = self.judge(self.inputs.ckpt_dir, step)
        if jax.process_count() > 1:
            values = np.asarray([figures[k] for k in JUDGE_FIGURES] if figures else [0.0] * len(JUDGE_FIGURES))
            figures = dict(zip(JUDGE_FIGURES, map(float, multihost_utils.broadcast_one_to_all(values))))
        self.result.judged[step] = figures
        self.writer.write(step, figures, prefix="judge")
        log_line(f"step {step}: {judge_line(figures)}")

    def _one_step(self, state, step: int):
        """Train step ``step + 1``: its batch, the update, the finite-loss check; metrics into ``result``."""
        cfg, inputs, result = self.cfg, self.inputs, self.result
        host = next(self.iterator)  # this process's rows of the global batch
        if inputs.num_rejects:
            bad, groups = degenerate_groups(host, 1 + inputs.num_rejects)
            if step == self.start and groups and bad == groups:
                raise DegenerateDataError(degenerate_message(cfg.data.seq_len, bad, groups, "of the first batch"))
            result.degenerate_groups += bad
            result.trained_groups += groups
        step_fn = self.steps_by_groups(global_max_groups(host))
        batch = batch_lib.to_global(batch_lib.prepare(host, seq_shards=inputs.seq_shards, slots=inputs.slots),
                                    inputs.mesh)
        self.profiler.before(step + 1)
        t0 = time.perf_counter()
        state, metrics = step_fn(state, batch)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        dt = time.perf_counter() - t0
        step += 1
        self.profiler.after(step)
        if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
            self._stop_non_finite(step, metrics)
        tokens = int(metrics["tokens"])
        result.tokens += tokens
        if step > self.start + 1:  # the run's first step includes its compilation
            result.train_s += dt
            result.timed_tokens += tokens
        result.last_metrics = self._throughput(metrics, host, dt)
        if cfg.stage == "sft":  # no chosen / rejected pair: the step returns zeros for the preference metrics
            for key in PREFERENCE_METRICS:
                result.last_metrics.pop(key, None)
        return state, step

    def _stop_non_finite(self, step: int, metrics: dict):
        self.ckpt.wait()
        good = self.ckpt.latest_step()
        raise NonFiniteLossError(
            f"non-finite loss ({metrics['loss']}) or gradient norm ({metrics['grad_norm']}) at step "
            f"{step}; stopping without saving it. Last good checkpoint: "
            f"{'step ' + str(good) + ' in ' + self.inputs.ckpt_dir if good is not None else 'none'}")

    def _save(self, step: int, state) -> None:
        """Start the save of ``step`` and say how long training waited for it: the whole write when saves are
        synchronous, the copy of the state to host memory when they are not."""
        started = time.perf_counter()
        self.ckpt.save(step, state, self.iterator.get_state(), self.cfg.to_dict(), self.mcfg)
        waited = time.perf_counter() - started
        log_line(f"checkpoint step {step}: " + (f"written in {waited:.1f} s" if not self.ckpt.async_save else
                                            f"training waited {waited:.1f} s, the write goes on in the background"))
        self.last_saved = step

    def _throughput(self, metrics: dict, host: dict, dt: float) -> dict:
        """The step's metrics with tokens/s, step time, MFU and peak device memory in place of its token counts."""
        tokens = metrics.pop("tokens")
        metrics.pop("count")
        # The LM head runs on the trained tokens only (steps.token_logprobs), over a seq axis too.
        head_tokens = int((host["loss_mask"] > 0).sum())
        flops = step_flops(self.mcfg, self.cfg.head, host["segment_ids"], head_tokens=head_tokens,
                           lora=self.lora) * jax.process_count()
        metrics["tokens_per_s"] = tokens / dt
        metrics["step_s"] = dt
        metrics["mfu"] = flops / dt / self.peak if self.peak else None
        metrics["peak_gib"] = peak_device_gib(self.inputs.mesh)
        return metrics


def judge_line(figures: dict) -> str:
    """Held-out judging's figures in words (JUDGE_FIGURES)."""
    agreement = figures["agreement"]
    return (f"held-out verdict accuracy {100 * figures['verdict_accuracy']:.1f}% over both orders, agreement "
            f"{'n/a' if agreement is None else f'{agreement:.2f}'}, {int(figures['unparsable'])} of "
            f"{int(figures['judgements'])} verdicts unparsable ({figures['seconds']:.1f} s)")


def _step_line(step: int, total_steps: int, metrics: dict) -> str:
    """A console line for a logged step when no progress bar is shown (``progress: false``)."""
    parts = [f"step {step}/{total_steps}", f"loss {metrics['loss']:.4f}"]
    for key, fmt in (("accuracy", "{:.3f}"), ("grad_norm", "{:.3g}"), ("lr", "{:.3g}"), ("tokens_per_s", "{:.0f}"),
                     ("step_s", "{:.3f}")):
        if metrics.get(key) is not None:
            parts.append(f"{key} {fmt.format(metrics[key])}")
    return "  ".join(parts)
