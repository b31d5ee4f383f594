"""XLA's C++ log lines that say nothing to a user while the memory plan compiles candidate steps.

``model.remat: auto`` compiles several candidate train steps, and most of those that do not fit the device make
XLA print lines meant for XLA's own developers: the GPU scheduler's "The byte size of input/output arguments
(...) exceeds the base limit (...). This indicates an error in the calculation!" (46 of them for one
Qwen3-8B ``--compile-only`` for ``h100x1``) and the rematerialization pass's "Can't reduce memory use below ...".
The plan reports every candidate's memory itself. XLA writes these lines from C++ straight to file descriptor
2, so no Python logging setting reaches them: :func:`quiet_xla_memory_lines` routes descriptor 2 through a
filter process while it is active, which passes every other line through as it comes and counts the hidden
ones; the caller logs the count once. A process rather than a thread of ours: if the compiler aborts, the
filter still reads what it wrote last (the reason) and prints it. ``LONGRM_XLA_LOG=all`` turns the filter off.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter

# (pattern, what it is): lines matching a pattern are counted, not shown.
MEMORY_LINES = (
    (r"gpu_hlo_schedule\.cc:\d+\] The byte size of input/output arguments",
     "XLA's GPU scheduler: a program's arguments exceed its memory limit"),
    (r"hlo_rematerialization\.cc:\d+\] Can't reduce memory use below",
     "XLA's rematerialization: memory target not reached"),
)

# The filter process: stdin lines to stdout unless a pattern matches; counts (what -> lines) to the file argv[2].
# It stops at the end of its input, when the caller restores the descriptor, and not on Ctrl-C.
_FILTER = r"""
import json, re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: keep draining to the end
patterns = [(re.compile(p.encode()), what) for p, what in json.loads(sys.argv[1])]
hidden, out = {}, sys.stdout.buffer
for line in sys.stdin.buffer:
    what = next((w for p, w in patterns if p.search(line)), None)
    if what is None:
        out.write(line)
        out.flush()
    else:
        hidden[what] = hidden.get(what, 0) + 1
with open(sys.argv[2], "w") as f:
    json.dump(hidden, f)
"""


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):  # Python's buffered text goes out before the descriptor moves
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def quiet_xla_memory_lines(hidden: Counter | None = None, stream_fd: int = 2):
    """Hide XLA's memory lines written to ``stream_fd`` while active; yields ``hidden`` (a new ``Counter`` when
    None), to which it adds what -> lines hidden, complete when the block exits. Hides nothing with
    ``LONGRM_XLA_LOG=all``."""
    hidden = Counter() if hidden is None else hidden
    if os.environ.get("LONGRM_XLA_LOG", "").lower() == "all":
        yield hidden
        return
    _flush_python_streams()
    saved = os.dup(stream_fd)
    handle, counts_path = tempfile.mkstemp(prefix="longrm_xla_log_", suffix=".json")
    os.close(handle)
    try:
        child = subprocess.Popen([sys.executable, "-S", "-c", _FILTER, json.dumps(MEMORY_LINES), counts_path],
                                 stdin=subprocess.PIPE, stdout=saved, stderr=saved)
    except OSError:  # no filter to be had: show everything rather than fail the compile
        os.close(saved)
        os.unlink(counts_path)
        yield hidden
        return
    os.dup2(child.stdin.fileno(), stream_fd)
    child.stdin.close()  # the descriptor holds the pipe's write end now
    try:
        yield hidden
    finally:
        _flush_python_streams()
        os.dup2(saved, stream_fd)  # the pipe's last write end closes: the filter reads to the end and stops
        os.close(saved)
        child.wait()
        with contextlib.suppress(OSError, ValueError):
            with open(counts_path) as f:
                hidden.update(json.load(f))
        with contextlib.suppress(OSError):
            os.unlink(counts_path)


@contextlib.contextmanager
def counted(log, hidden: Counter | None = None):
    """Yields ``hidden`` (a new ``Counter`` when None) for the :func:`quiet_xla_memory_lines` blocks inside;
    on exit, however it exits, logs :func:`summary` on ``log`` at INFO when anything was hidden."""
    hidden = Counter() if hidden is None else hidden
    try:
        yield hidden
    finally:
        if hidden:
            log.info(summary(hidden))


def summary(hidden: Counter) -> str:
    """One line for the log: what was hidden, or "" when nothing was."""
    if not hidden:
        return ""
    parts = "; ".join(f"{n} x {what}" for what, n in hidden.items())
    return (f"XLA printed {sum(hidden.values())} memory lines while compiling ({parts}); the programs' own "
            f"memory figures say what fits; LONGRM_XLA_LOG=all shows them")
