"""What every command-line entry point shares: one-line errors (tracebacks on request) and quiet logging.

A CLI's ``main(argv)`` is ``run_cli(body, argv)``: an exception escaping ``body`` prints ``error: <message>``
on stderr and exits 1; ``--debug`` (each parser declares it via ``add_debug_flag``) or ``LONGRM_DEBUG=1`` lets
the traceback through instead. Errors from our own code already name the file, row or key they are about, so
the message is what the user needs; the traceback is for bug reports.
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
import sys
from collections.abc import Callable, Sequence

DEBUG_ENV = "LONGRM_DEBUG"


class ExitStatus(enum.IntEnum):
    """The exit statuses of every CLI (README, "Exit status"); an error class names its own in ``exit_code``."""

    OK = 0
    UNEXPECTED = 1  # anything else (a bug, the environment): the error line says what
    INPUT_REFUSED = 2  # a flag, setting, path or data row the user gave; a missing file
    TRAINING_STOPPED = 3  # training stopped on its data or loss
    DOES_NOT_FIT = 4  # a program does not fit the device (or the host's free RAM)
    INTERRUPTED = 130  # SIGINT (128 + 2); a training run stopped by SIGTERM exits 143 (training.interrupt)


class InputError(ValueError):
    """Input the user gave (a flag, setting, path or data row) is refused; the message names it. Exit status 2.

    Every CLI exits with one scheme (README, "Exit status"): 0 done, 2 input refused, 3 training stopped on
    its data or loss, 4 a program does not fit the device (or the host's free RAM), 1 anything unexpected,
    130 / 143 interrupted. An error class says its status in ``exit_code``; this module sits below every layer, so
    any may raise it."""

    exit_code = ExitStatus.INPUT_REFUSED


# Messages we write for the user; any other exception type is printed with its type name (e.g. "KeyError: x").
_PLAIN_TYPES = (ValueError, OSError, RuntimeError)


_EXAMPLES = "Examples:\n"  # the first line of a CLI's epilog of example commands


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps the description to the terminal and keeps the examples' epilog as written (one command a line)."""

    def _fill_text(self, text, width, indent):
        if text.startswith(_EXAMPLES):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _DefaultsHelpFormatter(_HelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The same, with each flag's default appended to its help."""


def cli_parser(module: str, description: str, examples: Sequence[str] = (),
               show_defaults: bool = False) -> argparse.ArgumentParser:
    """The parser of ``python -m MODULE``: every CLI shows its name, its description and its example command lines
    the same way."""
    epilog = _EXAMPLES + "".join(f"  {line}\n" for line in examples) if examples else None
    return argparse.ArgumentParser(prog=f"python -m {module}", description=description, epilog=epilog,
                                   formatter_class=_DefaultsHelpFormatter if show_defaults else _HelpFormatter)


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true",
                        help=f"show the full traceback of an error (also: {DEBUG_ENV}=1)")


def add_strict_kernels_flag(parser, fallbacks: str) -> None:
    """``--strict-kernels``; ``fallbacks``: this CLI's examples of a slower fallback it would otherwise warn of."""
    parser.add_argument("--strict-kernels", action="store_true",
                        help=f"stop instead of warning when a slower fallback would run ({fallbacks})")


def add_no_progress_flag(parser) -> None:
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (they show only on a terminal anyway)")


def add_topology_flags(parser, what: str, examples: str) -> None:
    """``--compile-only``, ``--topology`` and ``--topology-slices``: compile ``what`` for a topology named like
    ``examples`` (training.compile_only / evaluation's compile-only), without data, weights or accelerator."""
    parser.add_argument("--compile-only", action="store_true",
                        help=f"compile {what} for --topology without data, weights or accelerator, print memory per "
                             "chip, FLOPs, kernels and collectives, and exit (non-zero when it does not fit)")
    parser.add_argument("--topology", metavar="NAME", help=f"with --compile-only: {examples}")
    parser.add_argument("--topology-slices", type=int, default=1, metavar="N", help="TPU multislice: N slices")


def debug_requested(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0", "false")


def error_line(error: BaseException) -> str:
    """``error: <message>`` on one line (later lines of a multi-line message are joined with " | ")."""
    text = " | ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if isinstance(error, KeyError) and error.args:  # str(KeyError) is the repr of its key
        text = str(error.args[0])
    if not isinstance(error, _PLAIN_TYPES) or not text:
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return f"error: {text}"


def run_cli(body: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> int:
    """Run ``body(argv)``; exceptions become one ``error:`` line and the exit status their class names
    (``exit_code``: :class:`InputError` 2; a missing file 2; anything else 1) unless debugging."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # transformers advises on import that PyTorch is missing: our CLIs use it for tokenizers and configs only
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    default_jax_platforms()
    fake_cpu_device_threads()  # before any backend starts: see its comment
    try:
        return body(argv) or ExitStatus.OK
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except ModuleNotFoundError as error:  # a Python without the project's packages, not a bug of ours
        if debug_requested(argv):
            raise
        print(f"error: {error}: this Python ({sys.executable}) lacks the project's dependencies; run it with the "
              "environment the project was installed into (.venv/bin/python, or `source .venv/bin/activate`), or "
              "`pip install -e .` into this one", file=sys.stderr)
        return ExitStatus.INPUT_REFUSED
    except Exception as error:  # noqa: BLE001 - the CLI boundary: every error becomes one line
        if debug_requested(argv):
            raise
        print(error_line(error), file=sys.stderr)
        return getattr(error, "exit_code",
                       ExitStatus.INPUT_REFUSED if isinstance(error, FileNotFoundError) else ExitStatus.UNEXPECTED)


def default_jax_platforms(environ=None) -> None:
    """``JAX_PLATFORMS=cpu`` on a host with libtpu installed (the ``test`` / ``tpu`` extras) but neither a TPU
    chip nor an NVIDIA GPU: JAX would otherwise start libtpu's TPU backend, which looks for TPU chips and
    workers and prints screenfuls of warnings before every CPU run. Left alone when JAX_PLATFORMS is set, on
    TPU and GPU hosts, and without libtpu. (Compiling for a TPU topology loads libtpu on its own:
    ``parallel.topology``.)"""
    environ = os.environ if environ is None else environ
    if environ.get("JAX_PLATFORMS") or not _libtpu_installed():
        return
    try:
        from jax._src import hardware_utils  # noqa: PLC0415 - private; the check jax's own TPU start-up makes
    except ImportError:
        return
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0 and not hardware_utils.has_visible_nvidia_gpu():
        environ["JAX_PLATFORMS"] = "cpu"
        if environ is os.environ and "jax" in sys.modules:  # jax read the variable when it was imported
            sys.modules["jax"].config.update("jax_platforms", "cpu")


def visible_gpu_ids(environ=None) -> list[str]:
    """The GPUs a process started with ``environ`` would see, found without starting any backend (a parent
    that started one would hold GPU memory its children need): CUDA_VISIBLE_DEVICES's entries as written
    when set, else the host's /dev/nvidiaN nodes in order."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [entry.strip() for entry in visible.split(",") if entry.strip()]
    try:
        nodes = os.listdir("/dev")
    except OSError:
        return []
    return sorted((n[6:] for n in nodes if n.startswith("nvidia") and n[6:].isdigit()), key=int)


def _libtpu_installed() -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec("libtpu") is not None


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging() -> None:
    """Our log lines at INFO and up on stderr, in one format with the time and the module; other libraries'
    (jax, orbax, ...) from WARNING up. Without it Python shows only warnings, bare, and drops our INFO lines
    (the memory plan's retries, the XLA lines it hid, the mesh it chose). Changes nothing where logging is
    already configured (a program that embeds ours, pytest)."""
    root = logging.getLogger()
    if root.handlers:  # configured by whoever runs us: their levels stand
        return
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    package = logging.getLogger("longrm_jax")
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)


def silence_absl_warnings() -> None:
    """orbax / grain log through absl; their routine warnings (e.g. about unset options) are noise to a CLI
    user. Our own logging is unaffected."""
    try:
        from absl import logging as absl_logging  # optional: absent without orbax / grain
    except ImportError:
        return
    absl_logging.set_verbosity(absl_logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)


# XLA:CPU runs a multi-device program's independent collectives concurrently on its intra-op thread pool, whose
# size is the number of cores. A collective blocks its thread until every device arrives, so with 8 fake devices
# on a 2-core machine the blocked threads can use up the pool while another device's collective waits in its
# queue: a deadlock that XLA ends ~40 s later by aborting the process ("Termination timeout ... exceeded").
# Measured on the 8-device BT step with gradient accumulation (tests/test_training_distributed.py): with the
# default pool (2 threads) 30 back-to-back steps deadlocked in every one of 3 tries, idle or loaded; with 8 threads
# too; with 16 and 32, 30 steps passed every time (2-core machine, jax 0.11.2). XLA sizes the pool from
# PJRT_NPROC when it is set.
THREADS_PER_FAKE_CPU_DEVICE = 4


def fake_cpu_device_threads(environ=None) -> int | None:
    """Set ``PJRT_NPROC`` (the CPU client's thread pool) to 4 threads per device when several fake CPU devices
    are asked for (``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``, or ``JAX_NUM_CPU_DEVICES``), so
    that their collectives cannot exhaust the pool (see above). Left alone when PJRT_NPROC or NPROC is set, or
    with one device. Must run before the first JAX backend starts. Returns the value set, or None."""
    environ = os.environ if environ is None else environ
    if environ.get("PJRT_NPROC") or environ.get("NPROC"):
        return None
    asked = [item.split("=", 1)[1] for item in environ.get("XLA_FLAGS", "").split()
             if item.startswith("--xla_force_host_platform_device_count=")]
    asked.append(environ.get("JAX_NUM_CPU_DEVICES", ""))
    try:
        count = max((int(value) for value in asked if value.strip()), default=0)
    except ValueError:  # not a number: JAX / XLA report it themselves
        return None
    if count <= 1:
        return None
    threads = max(os.cpu_count() or 1, THREADS_PER_FAKE_CPU_DEVICE * count)
    environ["PJRT_NPROC"] = str(threads)
    return threads
