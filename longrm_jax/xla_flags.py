"""XLA (GPU) flags that let the scanned decoder read each layer's weights in place.

The layers are stacked and run under ``jax.lax.scan``, so every layer reads its weights through a dynamic
slice of the stacked arrays. XLA's Triton matmuls cannot take such a slice as an operand, so XLA copies each
layer's q/o/gate/up/down slice before its matmul (a compiled Qwen3-8B decode step: five async
``dynamic_slice`` copies per layer, 25 GB written and read again per step, where the whole step must read
only 20 GB). With cuBLAS matmuls and XLA's dynamic-slice fusion the matmul reads the slice where it lies.
For a 32K-token prefill the copies are noise (< 1%); for decoding they are most of the step.

``GPU_MESH_XLA_FLAGS`` / ``GPU_MESH_COMPILER_OPTIONS``: collectives overlapped with compute on multi-GPU meshes.

Flags are read when the first backend starts: call :func:`add_gpu_xla_flags` before anything touches a device
(importing jax is fine), or export the flags in the shell.
"""

from __future__ import annotations

import logging
import os

GPU_DECODE_XLA_FLAGS = ("--xla_gpu_enable_dynamic_slice_fusion=true", "--xla_gpu_enable_triton_gemm=false")

# Training with ``remat="save_attention_out"``: XLA's dynamic-slice fusion (on by default in jax 0.11.2's XLA)
# clones the attention kernel's custom call so that one copy writes its output straight into the scan's stacked
# residual buffer, i.e. the forward kernel runs twice per layer and the saved recompute is lost (a compiled
# Qwen3-8B training step: two ``flash_attention_sm90`` calls in the forward loop body; one with the flag off).
# See docs/perf_training.md. Do not combine with GPU_DECODE_XLA_FLAGS in the same process.
GPU_TRAIN_XLA_FLAGS = ("--xla_gpu_enable_dynamic_slice_fusion=false",)

log = logging.getLogger(__name__)


def add_gpu_xla_flags(flags=GPU_DECODE_XLA_FLAGS, environ=None) -> str:
    """Append ``flags`` to ``XLA_FLAGS`` (those whose name is already set there are left as they are).

    Returns the new ``XLA_FLAGS``. Warns when a JAX backend is already running (then the flags take effect
    only in child processes). CPU-only runs ignore these GPU flags.
    """
    environ = os.environ if environ is None else environ
    current = environ.get("XLA_FLAGS", "")
    present = {item.split("=", 1)[0] for item in current.split()}
    added = [flag for flag in flags if flag.split("=", 1)[0] not in present]
    value = " ".join([current, *added]).strip()
    environ["XLA_FLAGS"] = value
    if added and environ is os.environ:
        from jax._src import xla_bridge  # noqa: PLC0415 - private, but the only way to ask

        if xla_bridge.backends_are_initialized():
            log.warning("XLA_FLAGS changed after the JAX backend started; %s apply to child processes only",
                        " ".join(added))
    return value


# Collective overlap for programs compiled for a mesh of several GPUs. With FSDP the layer scan gathers each
# layer's weights and reduce-scatters its gradients once per iteration. XLA's default schedule starts the
# forward's gather at the top of its own layer with almost nothing to hide behind (compiled h100x8 FSDP step: 2
# fusions between its start and done); pipelined, the gather runs behind the previous layer's attention kernel
# and matmuls. The pipelining flags are process-wide (the training CLI sets them before the backend starts); the
# rest go per program (``jax.jit``'s ``compiler_options``), so a one-GPU or CPU program compiles without them.
# With all of them set, Qwen3-8B SimPO 2 x 32K per GPU under mesh.fsdp=4 runs 2.7% faster, the memory plan
# unchanged (docs/perf_training.md, "Four GPUs of one host"). Structure test:
# tests/test_gpu_collective_overlap.py, which also compiles every option. A flag the user set in XLA_FLAGS wins.
GPU_MESH_XLA_FLAGS = (
    # start layer i+1's weight all-gather during layer i's iteration of the scan (forward and backward), and
    # finish layer i's gradient reduce-scatter during the next: only collectives inside loops are touched, so a
    # one-GPU program compiles without them. Process-wide flags: jax 0.11.2's XLA refuses them as compile options.
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_reduce_scatter=true",
)
GPU_MESH_COMPILER_OPTIONS = {
    # unroll the layer loop by two: a collective of one iteration overlaps the other iteration's compute
    "xla_gpu_enable_while_loop_double_buffering": True,
    # schedule collectives by their latency against the compute around them (on by default; stated, not assumed)
    "xla_gpu_enable_latency_hiding_scheduler": True,
    # NCCL kernels on a stream of the highest priority, so a collective is not queued behind matmuls it overlaps
    "xla_gpu_enable_highest_priority_async_stream": True,
    # combine a layer's weight gathers and gradient scatters (Qwen3-8B: 386 MB of bf16 weights per layer) into
    # one collective each instead of one per weight
    "xla_gpu_all_gather_combine_threshold_bytes": 512 << 20,
    "xla_gpu_reduce_scatter_combine_threshold_bytes": 512 << 20,
}


def gpu_mesh_compiler_options(mesh, environ=None) -> dict:
    """``GPU_MESH_COMPILER_OPTIONS`` for a program compiled for ``mesh`` when its devices are GPUs and there is more
    than one, less any option ``XLA_FLAGS`` already sets; otherwise none."""
    devices = list(mesh.devices.flat) if mesh is not None else []
    if len(devices) < 2 or devices[0].platform not in ("gpu", "cuda", "rocm"):
        return {}
    environ = os.environ if environ is None else environ
    present = {item.split("=", 1)[0].lstrip("-") for item in environ.get("XLA_FLAGS", "").split()}
    return {k: v for k, v in GPU_MESH_COMPILER_OPTIONS.items() if k not in present}
