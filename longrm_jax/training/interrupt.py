"""SIGINT / SIGTERM during the step loop: finish the step, save a checkpoint there, stop with a clear line.

TPU pods and spot GPUs are preempted with SIGTERM; Ctrl-C sends SIGINT. While the step loop runs, the first
such signal only sets a flag (the step in flight completes), and the previous handler is put back, so a second
signal acts at once (SIGINT: KeyboardInterrupt, SIGTERM: the default kill). After every step the loop asks
``StopSignals.agreed()``: on a multi-process run each process's flag is all-gathered (one int per process, one
small collective per step), so all processes stop after the same step and write the same checkpoint, whichever
of them got the signal. The loop then saves, waits for the save and raises ``TrainingInterrupted``; the CLI
exits ``128 + signal`` (130 for SIGINT, 143 for SIGTERM: the shell's convention for death by that signal, which
schedulers read as "interrupted", not "failed").
"""

from __future__ import annotations

import signal
import threading

import jax
from jax.experimental import multihost_utils
import numpy as np

HANDLED = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """The run stopped on a signal after ``step`` with a checkpoint of that step (``checkpoint_dir``)."""

    def __init__(self, signum: int, step: int, total_steps: int, checkpoint_dir: str, saved: bool):
        self.signum, self.step, self.total_steps = signum, step, total_steps
        self.checkpoint_dir, self.saved = checkpoint_dir, saved
        name = signal.Signals(signum).name
        where = (f"checkpoint of step {step} saved in {checkpoint_dir}; continue with --resume" if saved else
                 "no checkpoint saved (checkpoint.every=0 and at_end=false? none was asked for)")
        super().__init__(f"interrupted by {name}: stopped after step {step} of {total_steps}, {where}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopSignals:
    """Context manager catching SIGINT / SIGTERM as a stop request (main thread only; elsewhere a no-op)."""

    def __init__(self, announce=print):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._announce = announce

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
            self._announce(f"{signal.Signals(signum).name} received: finishing this step and saving a checkpoint "
                           "(send it again to stop at once)")
        for sig, handler in self._previous.items():  # a second signal acts at once
            signal.signal(sig, handler)

    def agreed(self) -> int | None:
        """The signal to stop on if this or (multi-process) any process received one, else None."""
        local = self.signum or 0
        if jax.process_count() > 1:
            local = int(np.max(multihost_utils.process_allgather(np.int32(local))))
        return local or None
