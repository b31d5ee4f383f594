"""Host memory: what this process may still allocate, what the data pipeline's batches take, and sizes printed
with enough digits to tell two figures apart.

On the CPU backend a device's arrays live in the host's RAM, whose allocator reports no limit. Without a check a
step too large for the machine was either killed by the kernel's OOM killer (exit 137, no message: a 100M-token
``data.seq_len``) or failed with RESOURCE_EXHAUSTED after compiling (``data.batch_rows=100000``, 827 GiB
predicted). So the memory plan takes the memory available now as the CPU devices' budget
(:func:`cpu_device_budget`), and :func:`check_data_buffers` refuses batches the host cannot hold on any backend,
before the pipeline packs the first one. Both refusals exit 4 (README, "Exit status").
"""

from __future__ import annotations

import os

import jax

from longrm_jax.cli_support import ExitStatus
from longrm_jax.parallel.topology import GiB

# Bytes per token of a packed host batch: input_ids, positions, segment_ids and loss_mask, int32 each
# (data.packing.BATCH_KEYS).
PACKED_BYTES_PER_TOKEN = 4 * 4
# Share of the available memory the CPU devices' step may plan for: XLA's figure leaves out the runtime's own
# allocations (compiled code, thread pools) and the Python heap grows while the run goes on.
CPU_AVAILABLE_SHARE = 0.9
# Training batches alive at once besides the step's own arrays: the one the step reads and one the pipeline has
# prefetched (data.pipeline: prefetch 2 is the default, 1 is the least it holds while the step runs).
BATCHES_IN_FLIGHT = 2


class HostMemoryError(RuntimeError):
    """The host cannot hold what the run needs (the data pipeline's batches). Exit status 4, as the memory
    plan's refusals."""

    exit_code = ExitStatus.DOES_NOT_FIT


def format_bytes(n: float, digits: int = 2) -> str:
    """``n`` bytes in the largest binary unit below it, ``digits`` decimals (0.001 GiB is "1.02 MiB", not the
    "0.00 GiB" a fixed unit gave)."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{int(n)} bytes"


def format_sizes(*values: float) -> list[str]:
    """:func:`format_bytes` of each value, with more decimals until values that differ print differently (a
    refusal reading "64.00 GiB > 64.00 GiB" tells nothing)."""
    for digits in range(2, 7):
        texts = [format_bytes(v, digits) for v in values]
        if len(set(texts)) == len({int(v) for v in values}):
            break
    return texts


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_dirs() -> list[tuple[str, str, str, str]]:
    """(directory, limit file, usage file, stat file) of this process's memory cgroup, v2 and v1, own path
    first, then the mount's root (a container sees its own cgroup there)."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        lines = []
    v2 = next((path for _, controllers, path in lines if controllers == ""), "/")
    v1 = next((path for _, controllers, path in lines if "memory" in controllers.split(",")), "/")
    found = []
    for root, path, names in (("/sys/fs/cgroup", v2, ("memory.max", "memory.current")),
                              ("/sys/fs/cgroup/memory", v1, ("memory.limit_in_bytes", "memory.usage_in_bytes"))):
        for directory in dict.fromkeys((os.path.join(root, path.lstrip("/")), root)):
            found.append((directory, *names, "memory.stat"))
    return found


def _cgroup_available() -> int | None:
    """What a cgroup memory limit (a container, a batch job) leaves this process: limit - usage, page cache the
    kernel can drop (inactive_file) not counted as used. None without a limit."""
    for directory, limit_file, usage_file, stat_file in _cgroup_dirs():
        limit = _read_int(os.path.join(directory, limit_file))
        usage = _read_int(os.path.join(directory, usage_file))
        if limit is None or usage is None or limit >= 2**60:  # "max" (v2) or the huge v1 value: no limit
            continue
        cache = 0
        try:
            with open(os.path.join(directory, stat_file), encoding="ascii") as f:
                stat = dict(line.split()[:2] for line in f if len(line.split()) >= 2)
            cache = int(stat.get("inactive_file", 0))
        except (OSError, ValueError):
            pass
        return max(0, limit - max(0, usage - cache))
    return None


def available_bytes() -> int | None:
    """Bytes this process can still allocate without swapping or meeting the OOM killer: the kernel's
    MemAvailable, capped by a cgroup memory limit. None where neither can be read (no check then)."""
    known = [v for v in (_meminfo_available(), _cgroup_available()) if v is not None]
    return min(known) if known else None


def batch_bytes(rows: int, row_tokens: int) -> int:
    """A packed host batch of ``rows`` rows of ``row_tokens`` tokens (plus its per-row group counts)."""
    return rows * (row_tokens * PACKED_BYTES_PER_TOKEN + 4)


def _row_tokens(cfg) -> int:
    slots = 1 + cfg.data.num_rejects if cfg.data.layout == "rows" else 1  # a rows-layout group: k slots
    return slots * cfg.data.seq_len


def train_batch_bytes(cfg) -> int:
    """One training batch of this process (its rows of the global batch; ``grad_accum`` micro steps)."""
    rows = max(1, cfg.pipeline_rows_per_step // max(1, jax.process_count()))
    return batch_bytes(rows, _row_tokens(cfg))


def _evaluates(cfg) -> bool:
    return cfg.evaluates_held_out and (cfg.data.eval_source is not None or cfg.data.source == "synthetic")


def check_data_buffers(cfg, available: int | None = None) -> None:
    """Refuse (``HostMemoryError``) a run whose data batches alone cannot fit the memory available now: one
    training batch, and one held-out batch when the run evaluates (held-out pairs are packed in memory up front,
    in batches of one micro step's rows). A lower bound: the pipeline holds more (prefetched batches, a packing
    window), so what it refuses cannot run. Nothing is checked with ``memory_check: false`` or where the
    available memory is unknown."""
    available = available_bytes() if available is None else available
    if not cfg.memory_check or available is None:
        return
    train = train_batch_bytes(cfg)
    eval_rows = max(cfg.pipeline_rows_per_step // cfg.grad_accum, 1)
    held_out = batch_bytes(eval_rows, _row_tokens(cfg)) if _evaluates(cfg) else 0
    if train + held_out <= available:
        return
    need, have, one = format_sizes(train + held_out, available, train)
    rows = max(1, cfg.pipeline_rows_per_step // max(1, jax.process_count()))
    parts = f"a training batch of {rows:,} rows x {_row_tokens(cfg):,} tokens ({one}, 4 int32 arrays)"
    if held_out:
        parts += f" and the held-out pairs' first batch ({format_sizes(held_out)[0]})"
    knobs = ["a shorter data.seq_len",
             "fewer data.batch_rows" + (" (grad_accum keeps the step's batch)" if eval_rows > 1 else "")]
    if cfg.grad_accum > 1:
        knobs.append("a smaller grad_accum (its micro steps' rows come in one batch)")
    if held_out:
        knobs.append("eval_before=false, eval_after=false and eval_every=0 (no held-out batches)")
    raise HostMemoryError(
        f"the data batches do not fit this host's memory: {parts} need at least {need}, available {have} (free "
        f"RAM now, within any cgroup limit); reduce it with: {'; '.join(knobs)} (memory_check=false skips this "
        "check)")


def cpu_device_budget(cfg, local_devices: int, available: int | None = None) -> int | None:
    """Bytes one CPU device's step may use: ``CPU_AVAILABLE_SHARE`` of the memory available now, less the
    training batches in flight, shared by this process's CPU devices (their arrays are all in its RAM). None
    where the available memory is unknown."""
    available = available_bytes() if available is None else available
    if available is None:
        return None
    free = CPU_AVAILABLE_SHARE * available - BATCHES_IN_FLIGHT * train_batch_bytes(cfg)
    return max(0, int(free // max(1, local_devices)))


def cpu_budget_line(local_devices: int) -> str:
    """What the CPU budget is, for the memory plan's refusal."""
    devices = f", shared by {local_devices} CPU devices" if local_devices > 1 else ""
    return (f"(CPU backend: the budget is {CPU_AVAILABLE_SHARE:.0%} of the host's free RAM now, less "
            f"{BATCHES_IN_FLIGHT} training batches{devices}; memory_budget_gib=N sets another, memory_check=false "
            "skips the check)")
