"""``python -m longrm_jax.train`` with a fault injected: SIGKILL the process at a step or while a save is in flight,
or send it another signal there (``trained:SIGTERM``: as a preempting scheduler would).

    python tests/helpers/train_and_kill.py {trained|saving}[:SIGNAL] STEP [train CLI arguments ...]

Installs ``training.loop.run``'s ``on_step`` callback, then runs the training CLI's own ``main``, so what is killed
is exactly the command users run. ``run_train_cli`` starts the CLI, or this driver, in a subprocess
(tests/test_training_resume.py, tests/test_training_rerun.py).
"""

import functools
import os
import signal
import subprocess
import sys

DRIVER = os.path.abspath(__file__)


def run_train_cli(sets, *extra, kill_at=None, timeout=600):
    """The training CLI with ``--set`` for each of ``sets`` and then ``extra``, in a subprocess on one CPU device;
    ``kill_at=(event, step)`` (e.g. ``("saving", 4)``, ``("trained:SIGTERM", 31)``) runs it through this driver."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    command = [sys.executable, "-m", "longrm_jax.train"] if kill_at is None else [
        sys.executable, DRIVER, kill_at[0], str(kill_at[1])]
    args = command + [a for s in sets for a in ("--set", s)] + list(extra)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


def main(argv: list[str]) -> int:
    event, _, name = argv[0].partition(":")
    kill_step, train_args = int(argv[1]), argv[2:]
    sig = getattr(signal, name or "SIGKILL")
    from longrm_jax import train
    from longrm_jax.training import loop

    def kill_at(step: int, what: str) -> None:
        if what == event and step == kill_step:
            os.kill(os.getpid(), sig)

    loop.run = functools.partial(loop.run, on_step=kill_at)
    return train.main(train_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
