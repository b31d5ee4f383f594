"""How much memory a run's programs may use: the device's allocator limit (less the GPU runtime's headroom), the
pinned host memory its offloaded activations may take, and the peak a run reached (reported per step)."""

from __future__ import annotations

import os

from longrm_jax.parallel.topology import GPU_RUNTIME_HEADROOM, GiB

# Share of the host's RAM that pinned activation buffers may take when no host budget is configured: the rest is
# for the process itself (data pipeline, checkpoint I/O, the Python heap).
HOST_RAM_SHARE = 0.75


def host_ram_bytes() -> int | None:
    """Physical RAM of this host (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_budget(local_devices: int, budget_gib: float | None = None) -> int | None:
    """Pinned host bytes one device's program may use: ``budget_gib`` when given (per device), else
    ``HOST_RAM_SHARE`` of the host's RAM shared by this process's local devices (their programs each hold
    their own offloaded activations). None when the RAM is unknown: no host check then."""
    if budget_gib is not None:
        return int(budget_gib * GiB)
    ram = host_ram_bytes()
    return None if ram is None else int(HOST_RAM_SHARE * ram / max(1, local_devices))


def device_budget(devices, budget_gib: float | None = None) -> int | None:
    """Bytes one device may use: ``budget_gib`` when given, else the smallest ``bytes_limit`` of the devices'
    allocators (GPU/TPU; the GPU pool is ``XLA_PYTHON_CLIENT_MEM_FRACTION`` of the card), less ``GPU_RUNTIME_HEADROOM``
    on a GPU. None on backends that
    report no limit (CPU): no check there unless a budget is configured."""
    if budget_gib is not None:
        return int(budget_gib * GiB)
    limits = []
    for d in devices:
        stats = d.memory_stats() if hasattr(d, "memory_stats") else None
        if not stats or not stats.get("bytes_limit"):
            return None
        headroom = GPU_RUNTIME_HEADROOM if getattr(d, "platform", "") == "gpu" else 0
        limits.append(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)) - headroom)
    return min(limits) if limits else None


def peak_device_gib(mesh) -> float | None:
    """Largest peak allocator use so far over this process's devices of ``mesh`` (None where not reported)."""
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in mesh.local_devices]
    return max(peaks) / GiB if peaks and all(p is not None for p in peaks) else None
