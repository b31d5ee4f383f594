"""One training run per output directory: a lock file holding the owner's pid, host and start time.

Two runs writing one ``output_dir`` interleave their checkpoints and metrics (steps 300, 300, 280, ...). The
first takes ``<output_dir>/.run.lock`` (created exclusively); a second stops with a message naming the holder.
A lock left by a run that died without releasing it (its pid is gone on this host) is taken over with a
warning; a lock from another host cannot be checked and is never taken over.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from longrm_jax.cli_support import ExitStatus

LOCK_NAME = ".run.lock"
logger = logging.getLogger(__name__)


class RunDirLockedError(RuntimeError):
    """Another live run holds the output directory."""

    exit_code = ExitStatus.INPUT_REFUSED  # the output_dir given is refused


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """``with RunLock(output_dir):`` holds the directory for this process (process 0 of a multi-host run)."""

    def __init__(self, output_dir: str):
        self.path = os.path.join(output_dir, LOCK_NAME)
        self.held = False
        self.created = False  # the directory did not exist: a run that wrote nothing into it removes it again

    def acquire(self) -> "RunLock":
        directory = os.path.dirname(self.path) or "."
        self.created = not os.path.isdir(directory)
        os.makedirs(directory, exist_ok=True)
        mine = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        for _ in range(2):  # a second try after removing a stale lock
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read_holder()
                if holder.get("host") == mine["host"] and isinstance(holder.get("pid"), int) \
                        and not _pid_alive(holder["pid"]):
                    logger.warning("%s: taking over the lock of run pid %s (started %s), which is no longer "
                                   "running", self.path, holder["pid"], holder.get("started", "?"))
                    os.remove(self.path)
                    continue
                raise RunDirLockedError(
                    f"{os.path.dirname(self.path)} is in use by another training run (pid {holder.get('pid', '?')} "
                    f"on {holder.get('host', '?')}, started {holder.get('started', '?')}): wait for it to finish, "
                    f"set another output_dir, or delete {self.path} if that run is gone") from None
            with os.fdopen(fd, "w") as handle:
                json.dump(mine, handle)
            self.held = True
            return self
        raise RunDirLockedError(f"{self.path}: could not take the lock")

    def _read_holder(self) -> dict:
        try:
            with open(self.path) as handle:
                holder = json.load(handle)
            return holder if isinstance(holder, dict) else {}
        except (OSError, ValueError):
            return {}

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            if self.created:  # a run that stopped before writing anything leaves no empty output_dir behind
                try:
                    os.rmdir(os.path.dirname(self.path) or ".")
                except OSError:  # not empty (config, metrics, checkpoints): the run's record stays
                    pass

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
