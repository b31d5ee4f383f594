"""What every attention implementation shares: the names of the implementations, the error for a mask or
backend an implementation cannot honour, the checkpoint names of kernel residuals, the shape checks, and the
current mesh's sizes. Imports nothing of the package, so kernels, the kernel choice and ring attention can all
rely on it.
"""

from __future__ import annotations

import jax

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "pallas", "pallas-mosaic", "pallas-triton", "splash", "ring")
PALLAS_IMPLS = ("pallas", "pallas-mosaic", "pallas-triton", "splash")  # custom calls the compiler cannot partition


class AttentionNotSupportedError(ValueError):
    """The requested implementation cannot compute this attention (mask, backend or package missing)."""


# ``checkpoint_name``s of a kernel's forward outputs inside its custom VJP (flash kernels): a remat policy that
# saves these two keeps the backward from re-running the forward kernel.
ATTENTION_OUT_NAME = "attention_kernel_out"
ATTENTION_LSE_NAME = "attention_kernel_lse"

# Position given to padding: larger than any real position, so causal masking already hides it (key j is
# visible to query i only if its position is <= the query's). Kernels pad their key blocks with it; the evaluator
# writes right-padding into a KV cache at it, so pads are never attended while the prefill itself runs without
# segment ids (pads follow the real tokens) and keeps the fastest kernel.
PAD_POSITION = 2**30


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (0 stays 0)."""
    return -(-n // multiple) * multiple


def check_impl(impl):
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention impl {impl!r}; valid: {', '.join(IMPLEMENTATIONS)}")


# Implementations that honour a sliding window (``window=``): key j visible to query i iff
# ``i - window < j <= i`` (HF's sliding_window): XLA's attention, cuDNN's (its sliding_window_length) and splash
# (its LocalMask). The others refuse a window rather than attend over everything; ring attention honours it on XLA
# blocks (ops.ring_window).
WINDOW_IMPLS = ("xla", "cudnn", "splash")


def window_kwargs(window) -> dict:
    """The ``window=`` keyword for a kernel call: absent without a window, so that kernels that honour none keep
    their signatures (only ``WINDOW_IMPLS`` take it)."""
    return {} if window is None else {"window": window}


def check_window(name, window, causal=True):
    """Refuse a sliding ``window`` that implementation ``name`` would not honour (or a non-causal one)."""
    if window is None:
        return
    if not causal or int(window) < 1:
        raise AttentionNotSupportedError(f"a sliding window needs causal attention and window >= 1 (got "
                                         f"window={window}, causal={causal})")
    if name not in WINDOW_IMPLS:
        raise AttentionNotSupportedError(
            f"impl={name!r} does not honour a sliding window (window={window}); implementations that do: "
            f"{', '.join(WINDOW_IMPLS)} (impl='auto' picks one)")


def check_interpret(name, interpret):
    """``interpret=True`` (the Pallas interpreter, for tests on any backend) exists for the splash kernel only."""
    if interpret and name != "splash":
        raise ValueError(f"interpret=True runs the TPU splash kernel in the Pallas interpreter; impl={name!r} "
                         "has no interpreted form (use impl='splash')")


def split_segment_ids(segment_ids, t, s):
    """``segment_ids`` is [B, T] (self-attention, T == S) or a pair (q_segment_ids [B,T], kv_segment_ids [B,S])."""
    if segment_ids is None:
        return None, None
    if isinstance(segment_ids, (tuple, list)):
        q_seg, kv_seg = segment_ids
    else:
        if t != s:
            raise ValueError(
                f"segment_ids [B, T] needs T == S (got T={t}, S={s}); pass (q_segment_ids, kv_segment_ids)"
            )
        q_seg = kv_seg = segment_ids
    if q_seg.shape[-1] != t or kv_seg.shape[-1] != s:
        raise ValueError(f"segment ids shapes {q_seg.shape}/{kv_seg.shape} do not match T={t}, S={s}")
    return q_seg, kv_seg


def check_shapes(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention expects q/k/v of rank 4 [B, T, H, D], got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k {k.shape} disagree on batch or head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]})")


def seq_axis_size(axis="seq"):
    """Size of ``axis`` in the current (abstract) mesh set by ``jax.set_mesh``; 1 when absent."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or axis not in mesh.axis_names:
        return 1
    return int(mesh.shape[axis])


def mesh_size():
    """Number of devices of the current (abstract) mesh; 1 when none is set."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh is None or mesh.empty else int(mesh.size)
