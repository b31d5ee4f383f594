"""``python -m longrm_jax.train`` with a fault injected: SIGKILL the process at a step or while a save is in flight,
or send it another signal there (``trained:SIGTERM``: as a preempting scheduler would).

    python tests/helpers/train_and_kill.py {trained|saving}[:SIGNAL] STEP [train CLI arguments ...]

Installs ``training.loop.run``'s ``on_step`` callback, then runs the training CLI's own ``main``, so what is killed
is exactly the command users run (tests/test_training_resume.py).
"""

import functools
import os
import signal
import sys


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
