"""Silent slow paths made loud: a faster kernel or plan that could not be used is one WARNING naming the reason
and the fix, counted for the run's summary, and an error under ``--strict-kernels``.

A fallback keeps a run going (a missing cuDNN version or a broken tokamax import still trains, slower), which is
right for a quick try and wrong for a measured or long run: there the user wants to know, or to stop. Each place
that falls back calls :func:`report` with a stable ``key``; the first report of a key logs the warning, every
report counts. ``set_strict(True)`` (the CLIs' ``--strict-kernels``, the training key ``strict_kernels``, or
``LONGRM_STRICT_KERNELS=1``) turns a report into :class:`SlowPathError` instead.

The places (each with its key):

* ``tokamax_import``: tokamax is installed but fails to import, so GPU attention falls back to cuDNN or XLA.
* ``cudnn_ragged_backward``: the cuDNN version check of the packed (ragged) backward failed or is too old, so
  packed rows use the recomputing backward.
* ``cudnn_recompute_backward``: JAX's private cuDNN API is unavailable, so ``impl='cudnn'`` differentiates by
  recomputing the forward.
* ``eval_slots_fallback``: an accelerator's ``memory_stats()`` failed, so continuous GRM evaluation runs a fixed
  small slot pool instead of one sized to the memory.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

STRICT_ENV = "LONGRM_STRICT_KERNELS"


class SlowPathError(RuntimeError):
    """A slow fallback was about to be taken under ``--strict-kernels``."""


_lock = threading.Lock()
_counts: dict[str, int] = {}
_strict: bool | None = None  # None: from the environment


def set_strict(strict: bool) -> None:
    global _strict
    _strict = bool(strict)


def strict() -> bool:
    if _strict is not None:
        return _strict
    return os.environ.get(STRICT_ENV, "").strip().lower() not in ("", "0", "false")


def report(key: str, reason: str, fix: str) -> None:
    """A slow path was taken (or is about to be): warn once per ``key``, count it; raise under strict mode."""
    message = f"slow path ({key}): {reason}. Fix: {fix}"
    if strict():
        raise SlowPathError(f"{message} (--strict-kernels turns this fallback into an error; drop it to run slower)")
    with _lock:
        first = key not in _counts
        _counts[key] = _counts.get(key, 0) + 1
    if first:
        logger.warning("%s", message)


def counts() -> dict[str, int]:
    """{key: times reported} since the start (or the last :func:`reset`)."""
    with _lock:
        return dict(_counts)


def add_counts(taken: dict[str, int]) -> None:
    """Count slow paths taken elsewhere (another process of the same run, e.g. an evaluation replica)."""
    with _lock:
        for key, n in taken.items():
            _counts[key] = _counts.get(key, 0) + n


def summary_line() -> str | None:
    """One line for a run's summary, or None when no slow path was taken."""
    taken = counts()
    if not taken:
        return None
    return ("slow paths taken: " + ", ".join(f"{key} x{n}" for key, n in taken.items())
            + " (reasons in the warnings above; --strict-kernels makes them errors)")


def reset() -> None:
    """Forget the counts and the strict setting (tests)."""
    global _strict
    with _lock:
        _counts.clear()
    _strict = None
