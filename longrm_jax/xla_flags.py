"""XLA (GPU) flags that let the scanned decoder read each layer's weights in place.

The layers are stacked and run under ``jax.lax.scan``, so every layer reads its weights through a dynamic
slice of the stacked arrays. XLA's Triton matmuls cannot take such a slice as an operand, so XLA copies each
layer's q/o/gate/up/down slice before its matmul (compiled H200 program of a Qwen3-8B decode step: five async
``dynamic_slice`` copies per layer, 25 GB written and read again per step, where the whole step must read
only 20 GB). With cuBLAS matmuls and XLA's dynamic-slice fusion the matmul reads the slice where it lies.
For a 32K-token prefill the copies are noise (< 1%); for decoding they are most of the step.

Flags are read when the first backend starts: call :func:`add_gpu_xla_flags` before anything touches a device
(importing jax is fine), or export the flags in the shell.
"""

from __future__ import annotations

import logging
import os

GPU_DECODE_XLA_FLAGS = ("--xla_gpu_enable_dynamic_slice_fusion=true", "--xla_gpu_enable_triton_gemm=false")

# Training with ``remat="save_attention_out"``: XLA's dynamic-slice fusion (on by default in jax 0.11.2's XLA)
# clones the attention kernel's custom call so that one copy writes its output straight into the scan's stacked
# residual buffer, i.e. the forward kernel runs twice per layer and the saved recompute is lost (compiled H200
# training step, Qwen3-8B shapes: two ``flash_attention_sm90`` calls in the forward loop body; one with the flag
# off). See docs/perf_training.md. Do not combine with GPU_DECODE_XLA_FLAGS in the same process.
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
