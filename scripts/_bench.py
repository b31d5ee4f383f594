"""What every benchmark script shares: flag names, warm-up + median timing, device naming, the
``docs/benchmarks.md`` append.

The scripts run from the repository root as ``python scripts/<name>.py`` with the package installed
(``pip install -e .``). Python puts a script's own folder first on ``sys.path``, so ``import _bench`` finds this
file with no path manipulation. Tests that load a script in-process put ``scripts/`` on the path the same way.

Common flags (``add_common_flags``):

- ``--smoke``: tiny shapes on the CPU, checks that the script runs; never records unless ``--benchmarks-md``
  names a file.
- ``--iters`` / ``--warmup``: timed repetitions (the median is reported) and untimed ones before them.
- ``--benchmarks-md PATH``: where the dated section goes (default ``docs/benchmarks.md``);
  ``--no-record``: print only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS_MD = os.path.join(REPO_ROOT, "docs", "benchmarks.md")
# HBM bandwidth per device kind (bytes/s), from the datasheets: H100 SXM 3.35 TB/s, H200 4.8 TB/s.
HBM_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12}
HEADER = """# Benchmarks

Measured numbers, one dated section per run; every run appends its own (never rewrite others').

"""


def add_common_flags(parser: argparse.ArgumentParser, *, iters: int | None = 5, warmup: int | None = 2,
                     iters_help: str = "timed repetitions (the median is reported)",
                     smoke_help: str = "tiny shapes on the CPU: checks that the script runs") -> None:
    """``--smoke``, ``--no-record``, ``--benchmarks-md`` and (unless ``iters``/``warmup`` is None) ``--iters`` /
    ``--warmup``."""
    parser.add_argument("--smoke", action="store_true", help=smoke_help)
    if iters is not None:
        parser.add_argument("--iters", type=int, default=iters, help=iters_help)
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup, help="untimed repetitions before the timed ones")
    parser.add_argument("--benchmarks-md", default=None, metavar="PATH",
                        help="markdown file to append the results to (default docs/benchmarks.md; "
                             "with --smoke only when given)")
    parser.add_argument("--no-record", action="store_true", help="print only, append nowhere")


def record_path(args: argparse.Namespace) -> str | None:
    """The file to append to, or None: ``--no-record``, or ``--smoke`` without an explicit ``--benchmarks-md``."""
    if args.no_record:
        return None
    if args.benchmarks_md:
        return args.benchmarks_md
    return None if getattr(args, "smoke", False) else BENCHMARKS_MD


def median_seconds(fn: Callable[..., object], *args, iters: int, warmup: int,
                   sync: Callable[[object], object] | None = None) -> float:
    """Median wall seconds of ``iters`` calls ``fn(*args)`` after ``warmup`` untimed ones; ``sync(result)`` waits
    for asynchronous work (default ``jax.block_until_ready``) inside each timed call."""
    if sync is None:
        import jax

        sync = jax.block_until_ready
    for _ in range(warmup):
        sync(fn(*args))
    times = []
    for _ in range(max(iters, 1)):
        start = time.perf_counter()
        sync(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def device_name(device=None) -> str:
    """``device_kind (platform)`` of ``device`` (default: the first JAX device), e.g. ``NVIDIA H200 (gpu)``."""
    if device is None:
        import jax

        device = jax.devices()[0]
    return f"{device.device_kind} ({device.platform})"


def devices_name(devices: Sequence | None = None) -> str:
    """``N x device_kind (platform)`` of ``devices`` (default: every JAX device)."""
    if devices is None:
        import jax

        devices = jax.devices()
    return f"{len(devices)} x {device_name(devices[0])}"


def hbm_bandwidth(device_kind: str) -> float | None:
    """Bytes/s of the device's HBM, None for a kind not in ``HBM_BANDWIDTH``."""
    return next((v for k, v in HBM_BANDWIDTH.items() if k in device_kind), None)


def command_line(argv: Sequence[str] | None = None, script: str | None = None) -> str:
    """How the run was started, for the record: ``python scripts/<name>.py <args>``."""
    script = script or os.path.relpath(os.path.abspath(sys.argv[0]), REPO_ROOT)
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join(["python", script, *(shlex.quote(a) for a in args)])


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> list[str]:
    """Lines of a markdown table; ``align`` has one character per column, ``l`` or ``r`` (default: all left)."""
    align = align or "l" * len(header)
    lines = ["| " + " | ".join(str(h) for h in header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def append_section(path: str, title: str, *, command: str, device: str, details: str = "",
                   table: Sequence[str] = (), notes: Iterable[str] = ()) -> None:
    """Append ``## title (date)``, then ``\\`command\\` on device[, details]``, the table and the notes as a list.

    Creates the file with a header when missing; never rewrites what is there.
    """
    lines = [f"\n## {title} ({utc_now()})\n", f"`{command}` on {device}" + (f", {details}" if details else "")
             + ("." if not details.endswith(".") else "")]
    if table:
        lines += [""] + list(table)
    notes = list(notes)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    new = not os.path.exists(path)
    with open(path, "a", encoding="utf-8") as handle:
        if new:
            handle.write(HEADER)
        handle.write("\n".join(lines) + "\n")
    print(f"appended to {os.path.normpath(path)}")


def write_random_hf(preset: str, head: str, out_dir: str) -> None:
    """A random model of ``preset``'s shapes as an HF checkpoint, with the bundled tokenizer's special ids."""
    from flax import nnx

    from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
    from longrm_jax.hf.save import save_pretrained
    from longrm_jax.models import build_model
    from longrm_jax.training.config import load_config
    from longrm_jax.training.data_source import load_tokenizer
    from longrm_jax.training.model_setup import preset_config

    stage = "bt" if head == "classifier" else "simpo"
    cfg = load_config(None, [f"stage={stage}", f"model.preset={preset}", f"model.head={head}"])
    tok = load_tokenizer(cfg.data)
    mcfg = preset_config(cfg, tok).replace(head=cfg.head, dtype="bfloat16", param_dtype="bfloat16",
                                           pad_token_id=tok.pad_id, eos_token_id=tok.eos_id)
    model = build_model(mcfg, rngs=nnx.Rngs(0))
    save_pretrained(model, out_dir, dtype="bfloat16", tokenizer_dir=TINY_TOKENIZER_DIR, progress=False)
