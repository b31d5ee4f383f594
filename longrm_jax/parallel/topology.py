"""Compile-only devices of a TPU slice or a GPU cluster, named as users name them, for ahead-of-time compiles.

``devices_for("v5p-64")`` returns the 32 chips of a v5p-64 slice as JAX devices that programs can be compiled
for (``jax.jit(f).lower(...).compile()``, memory and cost analysis included) but never run on, from any host,
CPU-only included (``jax.experimental.topologies``: libtpu describes TPU topologies; the CUDA plugin describes
GPUs from a target description, ``gpu_target_config``). The trainer's and evaluator's ``--compile-only
--topology NAME`` build their mesh from these devices, so a config is proven to compile and fit before a pod is
reserved (MaxText's ``train_compile.py`` and axlearn's AOT compile do the same for their users).

Names:
- TPU, as Cloud names slices: ``v5p-N`` and ``v4-N`` count TensorCores (2 per chip: v5p-8 is 4 chips),
  ``v6e-N`` and ``v5e-N`` (``v5litepod-N``) count chips. ``slices`` > 1: a multislice of that many slices
  (over DCN), each of the named shape.
- GPU: ``h100x8`` (one host of 8 H100 SXM 80 GB), ``h200x4``, ``h100x8x2`` (2 hosts x 8 GPUs).

Per chip the table holds the HBM a program may use and the dense bf16 peak (vendor figures; docs/flops.md).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class Chip:
    """One accelerator chip: JAX's ``device_kind``, HBM bytes per chip, dense bf16 FLOP/s per chip."""

    device_kind: str
    hbm_bytes: int
    peak_bf16: float


# TPU: Cloud TPU system architecture pages (HBM per chip, bf16 peak per chip). GPU: NVIDIA's SXM data sheets
# (dense bf16, no sparsity); HBM as the CUDA driver reports it (what XLA's target descriptions carry).
CHIPS = {
    "v4": Chip("TPU v4", 32 * GiB, 275e12),
    "v5e": Chip("TPU v5 lite", 16 * GiB, 197e12),
    "v5p": Chip("TPU v5", 95 * GiB, 459e12),
    "v6e": Chip("TPU v6 lite", 32 * GiB, 918e12),
    "h100": Chip("NVIDIA H100 80GB HBM3", 84_942_979_072, 989e12),
    "h200": Chip("NVIDIA H200 141GB HBM3e", 151_397_597_184, 989e12),
}

# TensorCores per chip (Cloud counts v4 / v5p slices in cores, v5e / v6e in chips).
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
# Slice shapes by chip count: 3-D tori (v4, v5p), 2-D (v5e, v6e).
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
              512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_TPU_NAME = re.compile(r"^(v4|v5p|v5e|v5litepod|v6e)-(\d+)$")
_GPU_NAME = re.compile(r"^(h100|h200)x(\d+)(?:x(\d+))?$")


class TopologyError(ValueError):
    """A topology name this module does not know, or a slice size the chip does not come in."""

    exit_code = 2  # a --topology the user named is refused


@dataclass(frozen=True)
class Topology:
    """A named slice or cluster: ``chips`` devices of ``chip`` in ``slices`` slices (hosts: the devices'
    ``process_index``, as the plugin lays them out)."""

    name: str
    platform: str  # "tpu" or "gpu"
    chip: Chip
    chips: int
    slices: int
    shape: str  # libtpu topology ("2x4x4") or the CUDA plugin's ("hosts x 1 x gpus")

    @property
    def label(self) -> str:
        return self.name if self.slices == 1 else f"{self.slices} x {self.name}"

    def devices(self):
        """The compile-only JAX devices (one per chip; per slice in slice order)."""
        return devices_for(self)


# A run on a GPU gives its programs the allocator's pool, XLA_PYTHON_CLIENT_MEM_FRACTION of the card (JAX's
# default 0.75; the README advises 0.95 for long rows), less GPU_RUNTIME_HEADROOM: what a GPU needs beyond the
# compiled program's figure, cuDNN's attention workspaces (Qwen3-8B 2 x 64K: peak 119.8 GiB for 115.8 predicted)
# and room against fragmentation (a step planned at 74.7 of 75.2 GiB cannot place its 60.4 GiB temporary block);
# docs/perf_training.md, "Predicted from the compiled program" and "The options and what they cost".
# training.memory_budget.device_budget takes the same off a real device's allocator limit; an explicit
# memory_budget_gib is taken as given.
GPU_RUNTIME_HEADROOM = 4 * GiB
ADVISED_GPU_MEM_FRACTION = 0.95


def program_budget(topology: Topology, environ=None) -> tuple[int, str]:
    """(bytes, how): the device memory a run's programs may use on one chip of ``topology``. TPU: the chip's HBM.
    GPU: the pool a run gets (``XLA_PYTHON_CLIENT_MEM_FRACTION`` where this process has it set, else the README's
    advised 0.95) less ``GPU_RUNTIME_HEADROOM``."""
    hbm = topology.chip.hbm_bytes
    if topology.platform != "gpu":
        return hbm, f"the chip's {hbm / GiB:.1f} GiB HBM"
    environ = os.environ if environ is None else environ
    set_here = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    fraction = float(set_here) if set_here else ADVISED_GPU_MEM_FRACTION
    budget = int(hbm * fraction) - GPU_RUNTIME_HEADROOM
    source = "as set here" if set_here else "the README's advice; JAX's default is 0.75"
    return budget, (f"{fraction:.0%} of {hbm / GiB:.1f} GiB HBM (XLA_PYTHON_CLIENT_MEM_FRACTION={fraction:g}, "
                    f"{source}) less {GPU_RUNTIME_HEADROOM / GiB:.0f} GiB of cuDNN workspace")


def known_names() -> str:
    tpu = ", ".join(f"{g}-N" for g in _CORES_PER_CHIP)
    return f"{tpu} (Cloud TPU slice names), h100xG, h200xG, h100xGxH (G GPUs per host x H hosts)"


def parse(name: str, slices: int = 1) -> Topology:
    """The topology ``name`` (see the module docstring), ``slices`` of it for a TPU multislice."""
    text = name.strip().lower()
    if slices < 1:
        raise TopologyError(f"--topology-slices must be >= 1, got {slices}")
    m = _TPU_NAME.match(text)
    if m:
        gen = "v5e" if m.group(1) == "v5litepod" else m.group(1)
        count = int(m.group(2))
        cores = _CORES_PER_CHIP[gen]
        chips, rest = divmod(count, cores)
        shapes = _SHAPES_3D if gen in ("v4", "v5p") else _SHAPES_2D
        if rest or chips not in shapes:
            sizes = ", ".join(f"{gen}-{c * cores}" for c in shapes)
            raise TopologyError(f"unknown TPU slice {name!r}: {gen} comes as {sizes}")
        return Topology(f"{gen}-{count}", "tpu", CHIPS[gen], chips * slices, slices, shapes[chips])
    m = _GPU_NAME.match(text)
    if m:
        if slices != 1:
            raise TopologyError("--topology-slices is for TPU multislice; name GPU hosts as h100xGxH")
        gpus, hosts = int(m.group(2)), int(m.group(3) or 1)
        if gpus < 1 or hosts < 1:
            raise TopologyError(f"bad GPU topology {name!r}: GPUs per host and hosts must be >= 1")
        return Topology(text, "gpu", CHIPS[m.group(1)], gpus * hosts, 1, f"{hosts}x1x{gpus}")
    raise TopologyError(f"unknown topology {name!r}; known: {known_names()}")


def prepare_host_for_compile_only() -> None:
    """The process compiles only: JAX's own backend is the CPU (no accelerator is looked for), and libtpu is told
    it runs on no TPU VM, so it neither queries a metadata server nor prints warnings about missing workers, and
    that other processes may load it too (by default libtpu takes a machine-wide lock file: a second compiling
    process, e.g. a parallel test worker, would fail). Call before anything starts a JAX backend."""
    import jax  # noqa: PLC0415

    os.environ["JAX_PLATFORMS"] = "cpu"
    for key, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", "v5p-8"),
                       ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_WORKER_ID", "0"),
                       ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
        os.environ.setdefault(key, value)
    jax.config.update("jax_platforms", "cpu")
    # A compile-only client can write persistent-cache entries but not load them back (JAX warns "PjRtCompiler
    # must be constructed with a Client"): a JAX_COMPILATION_CACHE_DIR set by the user would only add warnings.
    jax.config.update("jax_enable_compilation_cache", False)


def devices_for(topology: Topology | str, slices: int = 1):
    """Compile-only devices of ``topology`` (a ``Topology`` or a name). libtpu (``pip install
    'longrm_jax[tpu]'``) describes TPUs; the CUDA plugin (``longrm_jax[gpu]``) describes GPUs, no GPU needed."""
    from jax.experimental import topologies  # noqa: PLC0415

    topo = parse(topology, slices) if isinstance(topology, str) else topology
    try:
        if topo.platform == "tpu":
            gen = next(g for g, c in CHIPS.items() if c is topo.chip)
            # v4 runs its chip's two TensorCores as one device (megacore), as JAX does on a v4 VM; libtpu's
            # default description has a device per core (v4-8: 8 devices for 4 chips)
            extra = {"chip_config_name": "megacore"} if gen == "v4" else {}
            desc = topologies.get_topology_desc(platform="tpu", topology_name=f"{gen}:{topo.shape}",
                                                num_slices=topo.slices, **extra)
        else:
            gen = next(g for g, c in CHIPS.items() if c is topo.chip)
            desc = topologies.get_topology_desc(gen, "cuda", target_config=gpu_target_config(gen),
                                                topology=topo.shape)
    except Exception as e:  # noqa: BLE001 - a missing plugin or a refused description: say which
        need = "libtpu (pip install 'longrm_jax[tpu]')" if topo.platform == "tpu" else \
            "the CUDA plugin (pip install 'longrm_jax[gpu]')"
        raise TopologyError(f"cannot describe {topo.label} without the hardware: {type(e).__name__}: {e} "
                            f"(needs {need})") from e
    devices = list(desc.devices)
    if len(devices) != topo.chips:
        raise TopologyError(f"{topo.label}: expected {topo.chips} devices, the plugin described {len(devices)}")
    return devices


# What XLA's GPU compiler needs to know of a GPU it cannot see (stream_executor.GpuTargetConfigProto, the fields
# the CUDA plugin of jax 0.11 reads; values from the data sheets, as XLA's own target specs give them).
_GPU_INFO = {
    "h100": dict(core_count=132, memory_bandwidth=3_352_320_000_000, clock_rate_ghz=1.98, major=9, minor=0),
    "h200": dict(core_count=132, memory_bandwidth=4_800_000_000_000, clock_rate_ghz=1.98, major=9, minor=0),
}


def gpu_target_config(gen: str) -> str:
    """``GpuTargetConfigProto`` text for the GPU ``gen`` (h100, h200): what the CUDA plugin compiles for."""
    info, chip = _GPU_INFO[gen], CHIPS[gen]
    return "\n".join([
        "gpu_device_info {",
        "  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152",
        "  shared_memory_per_core: 233472 threads_per_core_limit: 2048 fpus_per_core: 128",
        "  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535",
        f"  core_count: {info['core_count']} memory_bandwidth: {info['memory_bandwidth']}",
        f"  l2_cache_size: 52428800 clock_rate_ghz: {info['clock_rate_ghz']}",
        f"  device_memory_size: {chip.hbm_bytes} shared_memory_per_block_optin: 232448",
        f"  cuda_compute_capability {{ major: {info['major']} minor: {info['minor']} }}",
        "  registers_per_core_limit: 65536 registers_per_block_limit: 65536",
        "}",
        'platform_name: "CUDA"',
        "dnn_version_info { major: 9 minor: 10 patch: 0 }",
        f'device_description_str: "{chip.device_kind}"',
    ])


def chip_of(device_kind: str) -> Chip | None:
    """The table's chip whose ``device_kind`` is ``device_kind`` (exact), else the first whose kind contains it
    or is contained in it (``NVIDIA H100 80GB HBM3`` matches H100 variants); None when unknown."""
    for chip in CHIPS.values():
        if chip.device_kind == device_kind:
            return chip
    for key, chip in CHIPS.items():
        if key.startswith("h") and key.upper() in device_kind:
            return chip
    return None


def host_count(devices) -> int:
    """Hosts (processes) the devices of a topology span."""
    return len({d.process_index for d in devices})


def step_seconds(flops: float, chips: int, peak: float, mfu: float) -> float:
    """Seconds a step of ``flops`` takes on ``chips`` chips of ``peak`` FLOP/s each at ``mfu``."""
    return flops / (chips * peak * mfu) if chips and peak and mfu else math.inf
