"""Which devices a program is built for: platform, device kind and GPU compute capability.

Every backend-dependent choice (attention kernel, tokamax / cuDNN availability, pinned host memory, the decode
kernel) asks this module about the devices the program is compiled *for*, never ``jax.default_backend()``: when
a program is compiled ahead of time for a TPU pod or a GPU mesh from a CPU host (``--compile-only --topology``,
``parallel.topology``), the default backend is the host's CPU while the mesh holds compile-only TPU or GPU
devices, and the program must take the path it would take on them.

Where the target comes from, first match: the argument (a ``Mesh``, a device or a sequence of devices); the
mesh set by ``jax.set_mesh`` (its abstract mesh's ``abstract_device``: what a jitted function or a
``shard_map`` body can see); else the first device of the default backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jax


@dataclass(frozen=True)
class Target:
    """``platform``: ``cpu``, ``gpu`` or ``tpu``; ``device_kind`` as JAX reports it (``TPU v5``, ``NVIDIA H100 80GB
    HBM3``); ``compute_capability``: a GPU's (9.0 for Hopper), 0.0 elsewhere or when unknown."""

    platform: str
    device_kind: str
    compute_capability: float = 0.0

    @property
    def is_gpu(self) -> bool:
        return self.platform == "gpu"

    @property
    def is_tpu(self) -> bool:
        return self.platform == "tpu"


# Compute capability by device kind, for an abstract device (which carries only its kind). Real and compile-only
# GPU devices report their own.
_KIND_CAPABILITY = ((r"\bB[23]00\b|\bGB[23]00\b", 10.0), (r"\bH[12]00\b|\bH800\b|\bH20\b|\bGH200\b", 9.0),
                    (r"\bL40|\bL4\b|RTX 40|\bAda\b", 8.9), (r"\bA100\b|\bA800\b|\bA30\b", 8.0),
                    (r"\bA10\b|\bA40\b|A6000|RTX 30", 8.6))


def _capability_of_kind(kind: str) -> float:
    return next((cc for pattern, cc in _KIND_CAPABILITY if re.search(pattern, kind)), 0.0)


def _of_device(device) -> Target:
    platform = "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform
    cc = getattr(device, "compute_capability", None)
    kind = str(getattr(device, "device_kind", ""))
    capability = float(cc) if cc else (_capability_of_kind(kind) if platform == "gpu" else 0.0)
    return Target(platform, kind, capability)


def target_of(where=None) -> Target:
    """The target of ``where`` (a Mesh, a device, a sequence of devices) or, when None, of the current mesh."""
    if where is None:
        abstract = jax.sharding.get_abstract_mesh()  # also inside jit and shard_map, unlike the concrete mesh
        device = getattr(abstract, "abstract_device", None) if abstract is not None and not abstract.empty else None
        if device is None:
            return _of_device(jax.devices()[0])
        target = _of_device(device)
        if target.is_gpu and not target.compute_capability:  # a kind the table lacks: ask a local GPU
            local = jax.devices()[0]
            if _of_device(local).is_gpu:
                return Target(target.platform, target.device_kind, _of_device(local).compute_capability)
        return target
    if hasattr(where, "devices") and hasattr(where, "axis_names"):  # a Mesh
        return _of_device(where.devices.flat[0])
    if isinstance(where, (list, tuple)):
        return _of_device(where[0])
    return _of_device(where)
