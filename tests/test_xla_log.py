"""longrm_jax.xla_log: XLA's memory lines, written to file descriptor 2 as XLA's C++ logging writes them, are
counted and not shown while the memory plan compiles; every other line passes through in order."""

import os

from longrm_jax import xla_log

SCHEDULER = (b"E1126 23:24:06.713176    9155 gpu_hlo_schedule.cc:1068] The byte size of input/output arguments "
             b"(311385128964) exceeds the base limit (67954383257). This indicates an error in the calculation!\n")
REMAT = (b"W1126 23:18:18.388905    5238 hlo_rematerialization.cc:3363] Can't reduce memory use below 46.39GiB "
         b"(49809604896 bytes) by rematerialization; only reduced to 88.08GiB\n")


def test_memory_lines_are_counted_and_the_rest_passes_through(capfd, monkeypatch):
    monkeypatch.delenv("LONGRM_XLA_LOG", raising=False)
    with xla_log.quiet_xla_memory_lines() as hidden:
        os.write(2, b"first line\n" + SCHEDULER + SCHEDULER[:40])  # a line split over two writes
        os.write(2, SCHEDULER[40:] + REMAT + b"E1126 other.cc:1] a real error\nno newline at the end")
    err = capfd.readouterr().err
    assert err == "first line\nE1126 other.cc:1] a real error\nno newline at the end"
    assert hidden == {"XLA's GPU scheduler: a program's arguments exceed its memory limit": 2,
                      "XLA's rematerialization: memory target not reached": 1}
    assert xla_log.summary(hidden).startswith("XLA printed 3 memory lines while compiling")
    assert xla_log.summary(type(hidden)()) == ""
    os.write(2, SCHEDULER)  # after the block: the descriptor is back
    assert capfd.readouterr().err == SCHEDULER.decode()


def test_longrm_xla_log_all_shows_everything(capfd, monkeypatch):
    monkeypatch.setenv("LONGRM_XLA_LOG", "all")
    with xla_log.quiet_xla_memory_lines() as hidden:
        os.write(2, SCHEDULER)
    assert capfd.readouterr().err == SCHEDULER.decode() and not hidden


def test_what_the_compiler_writes_before_it_aborts_is_still_shown(tmp_path):
    """The filter is a process of its own: a compiler that aborts inside the block (an XLA check failure) loses
    nothing it wrote, the reason included."""
    import subprocess
    import sys

    code = ("import os\nfrom longrm_jax import xla_log\nwith xla_log.quiet_xla_memory_lines():\n"
            f"    os.write(2, {SCHEDULER!r} + b'F1126 some_pass.cc:1] Check failed: the reason\\n')\n"
            "    os.abort()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "LONGRM_XLA_LOG"})
    assert proc.returncode != 0
    assert b"Check failed: the reason" in proc.stderr and b"byte size" not in proc.stderr


def test_ctrl_c_inside_the_block_leaves_stderr_whole():
    """Ctrl-C reaches the whole process group, the filter included: it ignores SIGINT and drains to the end, so
    the caller's descriptor comes back and nothing written before or after is lost (no traceback of its own).
    The child sleeps in short naps: a SIGINT that the kernel hands to another of its threads interrupts no
    sleep of the main thread, which notices it at its next nap's end (one 60 s sleep let it go unseen)."""
    import signal
    import subprocess
    import sys

    code = ("import os, time\nfrom longrm_jax import xla_log\ntry:\n    with xla_log.quiet_xla_memory_lines():\n"
            "        os.write(2, b'before\\n')\n        for _ in range(600):\n            time.sleep(0.1)\n"
            "except KeyboardInterrupt:\n"
            "    os.write(2, b'interrupted\\n')\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if k != "LONGRM_XLA_LOG"})
    first = proc.stderr.readline()  # through the filter: the block is entered
    os.killpg(proc.pid, signal.SIGINT)
    err = first + proc.communicate(timeout=60)[1]
    assert proc.returncode == 0 and err == b"before\ninterrupted\n", err
