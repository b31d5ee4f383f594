"""Which single-device kernel runs an attention: ``resolve_impl``, ``local_impl`` and the kernel objects.

``auto`` picks ring attention when the current mesh has a ``seq`` axis of size > 1; otherwise the fastest
kernel for fwd+bwd that can honour the requested mask on the target devices (``parallel.target``: the
current mesh's, so a program compiled for a TPU topology from a CPU host picks splash); on a GPU at 32K-128K the
hybrid ``pallas`` > ``cudnn`` > ``pallas-mosaic`` (docs/benchmarks.md, "attention kernels").
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from longrm_jax.ops import flash, slow_paths
from longrm_jax.ops.contract import check_impl, check_interpret, seq_axis_size
from longrm_jax.ops.xla_attention import XlaBlockKernel
from longrm_jax.parallel.target import target_of


def resolve_impl(impl="auto", *, has_segment_ids=False, ring_axis="seq", cross_lengths=False, dtype=None,
                 window=None):
    """The concrete implementation ``impl`` stands for on this backend and the current mesh.

    ``cross_lengths``: T != S (decoding against a cache): ``auto`` then picks ``xla``, which any mesh
    can partition and which aligns the causal mask to the end of the keys. ``window``: a sliding window, which
    only ``WINDOW_IMPLS`` honour (``auto`` picks one; ring attention refuses it).
    """
    check_impl(impl)
    if impl != "auto":
        return impl
    if cross_lengths:
        return "xla"
    if seq_axis_size(ring_axis) > 1:
        return "ring"
    return local_impl("auto", has_segment_ids=has_segment_ids, dtype=dtype, window=window)


def _half_precision(dtype) -> bool:
    return dtype is None or jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@functools.cache
def warn_missing_tokamax(fallback: str) -> None:
    """Once per process: without tokamax a GPU runs a slower kernel (Qwen3-8B at 2 x 32K tokens trains at
    43.8% MFU instead of 48.3%), which otherwise goes unnoticed."""
    reason = flash.tokamax_unavailable_reason() or "not installed"
    fix = ("install the GPU extra: pip install \"longrm_jax[gpu]\"" if reason == "not installed" else
           "repair the GPU extra: pip install --force-reinstall \"longrm_jax[gpu]\"")
    slow_paths.report("tokamax_import", f"tokamax is {reason}: attention on this GPU falls back from the 'pallas' "
                      f"kernel to {fallback!r} (slower)", fix)


def local_impl(impl="auto", *, has_segment_ids=False, dtype=None, window=None):
    """The single-device kernel for ``impl`` (``auto`` -> fastest available that honours the mask and takes
    ``dtype``, the queries' dtype: the GPU flash kernels take bf16 / fp16 only, so fp32 runs XLA's attention;
    a sliding ``window``: splash on TPU, cuDNN on a Hopper GPU for bf16 / fp16 without segment ids, else XLA's
    attention)."""
    check_impl(impl)
    if impl == "ring":
        raise ValueError("'ring' is not a single-device kernel")
    if impl != "auto":
        return impl
    target = target_of()  # the devices the program is built for (a compile-only TPU/GPU mesh too), not the host's
    if window is not None:
        if target.is_tpu:
            return "splash"  # its LocalMask
        if target.is_gpu:
            if _half_precision(dtype) and not has_segment_ids and flash.cudnn_window_available(target):
                return "cudnn"  # its sliding_window_length skips the key blocks outside the window
            slow_paths.report("window_attention", f"sliding-window attention (window {window}) runs XLA's "
                              "blockwise attention: only cuDNN takes a window on the GPU, for bf16 / fp16 rows "
                              "without segment ids on compute capability >= 9.0",
                              "model.compute_dtype=bfloat16 and data.layout=rows (Gemma 3's local layers)")
        return "xla"
    if target.is_tpu:
        return "splash"
    if target.is_gpu and not _half_precision(dtype):
        slow_paths.report("fp32_attention", f"{dtype} attention on the GPU runs XLA's attention (the flash kernels "
                          "take bfloat16 / float16 only)", "model.compute_dtype=bfloat16 (evaluate: --dtype "
                          "bfloat16), as the shipped configs train")
        return "xla"
    if target.is_gpu:
        # fwd+bwd TFLOP/s at 32K (docs/benchmarks.md, "attention kernels"): hybrid pallas ~ cuDNN's backward +
        # a faster forward > cudnn 550 > tokamax mosaic alone 488. Only tokamax honours segment ids.
        if flash.hybrid_available(target) or (has_segment_ids and flash.tokamax_available()
                                              and target.compute_capability >= 9.0):
            return "pallas"
        if not flash.tokamax_available():
            warn_missing_tokamax("cudnn" if not has_segment_ids else "xla")
        if not has_segment_ids:
            return "cudnn"
    return "xla"


def block_kernel(impl="auto", *, has_segment_ids=False, interpret=False, dtype=None):
    """The single-device kernel object (``fwd``/``bwd`` with LSE residuals) that ring attention drives.

    ``impl`` may also be a kernel object itself (anything with those two methods), e.g. for tests.
    ``interpret``: splash blocks in the Pallas interpreter (tests on any backend).
    """
    if not isinstance(impl, str):
        return impl
    name = local_impl(impl, has_segment_ids=has_segment_ids, dtype=dtype)
    check_interpret(name, interpret)
    if name == "xla":
        return XlaBlockKernel
    return flash.get_kernel(name, interpret)
