"""XLA's C++ log lines that say nothing to a user while the memory plan compiles candidate steps.

``model.remat: auto`` compiles several candidate train steps, and most of those that do not fit the device make
XLA print lines meant for XLA's own developers: the GPU scheduler's "The byte size of input/output arguments
(...) exceeds the base limit (...). This indicates an error in the calculation!" (46 of them for one
Qwen3-8B ``--compile-only`` on an H100) and the rematerialization pass's "Can't reduce memory use below ...".
The plan reports every candidate's memory itself. XLA writes these lines from C++ straight to file descriptor
2, so no Python logging setting reaches them: :func:`quiet_xla_memory_lines` routes descriptor 2 through a pipe
while it is active, passes every other line through as it comes and counts the hidden ones, which the caller
logs once. ``LONGRM_XLA_LOG=all`` turns the filter off.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections import Counter

# (pattern, what it is): lines matching a pattern are counted, not shown.
MEMORY_LINES = (
    (re.compile(rb"gpu_hlo_schedule\.cc:\d+\] The byte size of input/output arguments"),
     "XLA's GPU scheduler: a program's arguments exceed its memory limit"),
    (re.compile(rb"hlo_rematerialization\.cc:\d+\] Can't reduce memory use below"),
     "XLA's rematerialization: memory target not reached"),
)


def _kind(line: bytes) -> str | None:
    return next((what for pattern, what in MEMORY_LINES if pattern.search(line)), None)


@contextlib.contextmanager
def quiet_xla_memory_lines(hidden: Counter | None = None, stream_fd: int = 2):
    """Hide XLA's memory lines written to ``stream_fd`` while active; yields ``hidden`` (a new ``Counter`` when
    None), to which it adds what -> lines hidden, complete when the block exits. Hides nothing with
    ``LONGRM_XLA_LOG=all``."""
    hidden = Counter() if hidden is None else hidden
    if os.environ.get("LONGRM_XLA_LOG", "").lower() == "all":
        yield hidden
        return
    for stream in (sys.stdout, sys.stderr):  # Python's buffered text goes out before the descriptor moves
        with contextlib.suppress(Exception):
            stream.flush()
    saved = os.dup(stream_fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, stream_fd)
    os.close(write_end)

    def write(data: bytes) -> None:
        try:
            os.write(saved, data)
        except OSError:  # the reader of stderr went away: keep draining the pipe so that no writer blocks
            pass

    def forward():
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                shown = []
                for line in lines:
                    if (what := _kind(line)) is not None:
                        hidden[what] += 1
                    else:
                        shown.append(line + b"\n")
                if shown:
                    write(b"".join(shown))
            if pending:
                write(pending)

    thread = threading.Thread(target=forward, name="xla-log-filter", daemon=True)
    thread.start()
    try:
        yield hidden
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved, stream_fd)  # the pipe's last write end closes: the thread reads to the end and stops
        thread.join()
        os.close(saved)


def summary(hidden: Counter) -> str:
    """One line for the log: what was hidden, or "" when nothing was."""
    if not hidden:
        return ""
    parts = "; ".join(f"{n} x {what}" for what, n in hidden.items())
    return (f"XLA printed {sum(hidden.values())} memory lines while compiling ({parts}); the programs' own "
            f"memory figures say what fits; LONGRM_XLA_LOG=all shows them")
