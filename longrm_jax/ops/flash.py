"""Accelerator kernels behind ``impl="cudnn"`` and ``impl="pallas"``.

Every kernel object offers ``attention`` and ``attention_with_lse`` (differentiable) and, where the
hardware kernel exposes a backward pass that takes externally supplied softmax statistics, the block
interface ring attention drives: ``fwd -> (out, lse)`` and ``bwd(q, k, v, out, lse, dout) -> (dq, dk, dv)``
from the *global* out/lse.

- ``TokamaxKernel``: tokamax (optional ``gpu`` extra) Pallas kernels: Mosaic GPU (sm80/sm90/sm100) or
  Triton. Packed rows become per-query key ranges ``[k_start, k_end)`` (tokamax ``Mask``), which is exact
  when each segment id fills one contiguous run of the keys (true of packed rows, and of every ring block
  of a packed row). A row whose key segments are not contiguous makes the output NaN rather than wrong.
  Residuals: tokamax returns ``(m, l)`` with ``lse = m + log l``; its VJP op accepts ``(m=lse, l=1)``.
- ``HybridKernel`` (the ``pallas`` kernel on Hopper+ GPUs): tokamax's Mosaic forward (faster than cuDNN's)
  with cuDNN's flash backward (faster than tokamax's) fed tokamax's LSE, via ``ops.cudnn_flash`` (JAX's
  private cuDNN primitives, feature-detected); with segment ids cuDNN's ragged (packed) backward
  (``ops.cudnn_packed``). When cuDNN cannot run the shape or the batch, or the private API is missing
  (logged warning), its backward is tokamax's own VJP.
- ``CudnnKernel``: cuDNN flash attention; no segment ids. Forward statistics in fp32 and a ring block
  backward from the global out/LSE through ``ops.cudnn_flash`` when available; otherwise
  ``jax.nn.dot_product_attention`` (bf16-rounded LSE) and no ring backward.
- ``SplashKernel`` (TPU, ``impl="splash"``; also what ``pallas`` means on TPU): see ``ops.splash``.

Gradients through the LSE output of ``attention_with_lse`` are supported by ``xla`` only; the kernels
raise ``NotImplementedError`` if a non-zero LSE cotangent reaches them (never a silently wrong gradient).
"""

from __future__ import annotations

import contextlib
import functools
import logging

import jax
import jax.numpy as jnp

from longrm_jax.ops import cudnn_flash, cudnn_packed, slow_paths
from longrm_jax.ops.contract import AttentionNotSupportedError, check_interpret, window_kwargs
from longrm_jax.ops.kernel_vjp import LseVjpKernel, lse_vjp_kernel
from longrm_jax.ops.splash import SplashKernel
from longrm_jax.parallel.target import target_of


# ------------------------------------------------------------------------------------------ tokamax


def register_xprof_stub():
    """Empty ``xprof`` modules so tokamax imports where xprof is not installed (e.g. air-gapped GPU hosts).

    tokamax imports ``xprof.cli.tools.get_kernel_stats_tool`` at import time, for its benchmarking helpers
    only; the attention kernels never touch it.
    """
    import sys  # noqa: PLC0415
    import types  # noqa: PLC0415

    for name in ("xprof", "xprof.cli", "xprof.cli.tools"):
        if sys.modules.get(name) is None:
            sys.modules[name] = types.ModuleType(name)
    sys.modules["xprof.cli.tools"].get_kernel_stats_tool = None
    sys.modules["xprof"].cli = sys.modules["xprof.cli"]
    sys.modules["xprof.cli"].tools = sys.modules["xprof.cli.tools"]


@functools.cache
def _tokamax():
    try:
        import tokamax  # noqa: PLC0415 - optional heavy dependency, imported on first use
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("xprof"):
            raise
        import logging  # noqa: PLC0415

        logging.getLogger(__name__).warning("xprof is not installed: registering an empty stand-in for tokamax")
        register_xprof_stub()
        import tokamax  # noqa: PLC0415
    return tokamax


_COMPILE_TARGET: list = []  # the first device of the programs being compiled by ``compiling_for``, if any


@contextlib.contextmanager
def compiling_for(devices):
    """Context for tracing and compiling programs for ``devices`` that may be compile-only (a topology's,
    ``parallel.topology``). tokamax picks its kernel variant (sm90 Mosaic...) by JAX's default device, this
    host's CPU: its kernels are traced with the target's first device as the default device instead, and on
    GPUs tokamax cross-compiles (skips its check for a visible GPU)."""
    with contextlib.ExitStack() as stack:
        if target_of(devices).is_gpu and tokamax_available():
            stack.enter_context(_tokamax().config.cross_compile(True))
        _COMPILE_TARGET.append(devices[0])
        stack.callback(_COMPILE_TARGET.pop)
        yield


def _on_target():
    """Inside ``compiling_for``: the target device as JAX's default device while a tokamax kernel is traced."""
    return jax.default_device(_COMPILE_TARGET[-1]) if _COMPILE_TARGET else contextlib.nullcontext()


@functools.cache
def tokamax_available() -> bool:
    """tokamax imports (it needs the ``gpu`` extra; its import pulls ``xprof``)."""
    return tokamax_unavailable_reason() is None


@functools.cache
def tokamax_unavailable_reason() -> str | None:
    """None when tokamax imports; else why not: "not installed", or the import error of an installed tokamax (a
    broken install must not read as a missing one)."""
    try:
        _tokamax()
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "tokamax":
            return "not installed"
        return f"installed, but its import fails ({type(e).__name__}: {e})"
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"; the reason is kept
        return f"installed, but its import fails ({type(e).__name__}: {e})"
    return None


def segment_key_ranges(q_segment_ids, kv_segment_ids):
    """Per-query key ranges equivalent to the segment mask, and whether that equivalence holds.

    Returns ``k_start, k_end`` int32 [B, T] (query i sees keys ``k_start[i] <= j < k_end[i]``; empty when its
    segment has no key) and ``exact`` bool [B]: every segment id occupies one contiguous run of the keys.
    """

    def one_row(q_seg, kv_seg):
        order = jnp.argsort(kv_seg, stable=True)
        sorted_seg = kv_seg[order]
        left = jnp.searchsorted(sorted_seg, q_seg, side="left")
        right = jnp.searchsorted(sorted_seg, q_seg, side="right")
        count = right - left
        first = order[jnp.clip(left, 0, kv_seg.shape[0] - 1)]
        k_start = jnp.where(count > 0, first, 0)
        k_end = jnp.where(count > 0, first + count, 0)
        runs = jnp.sum(kv_seg[1:] != kv_seg[:-1])
        distinct = jnp.sum(sorted_seg[1:] != sorted_seg[:-1])
        return k_start.astype(jnp.int32), k_end.astype(jnp.int32), runs == distinct

    return jax.vmap(one_row)(q_segment_ids.astype(jnp.int32), kv_segment_ids.astype(jnp.int32))


def _poison_unless(exact, x, axis_b=0):
    """NaN-fill the batch rows whose mask could not be expressed exactly (loud instead of wrong)."""
    if exact is None:
        return x
    shape = [1] * x.ndim
    shape[axis_b] = x.shape[axis_b]
    return jnp.where(exact.reshape(shape), x, jnp.nan)


class TokamaxKernel(LseVjpKernel):
    """tokamax flash attention. ``implementation``: ``mosaic`` | ``triton`` | ``xla`` (the last for CPU tests)."""

    def __init__(self, implementation="mosaic"):
        self.implementation = implementation
        self.name = f"pallas[{implementation}]"
        # The Mosaic/Triton VJPs compute delta = rowsum(out * dout) from the out they are given, so global
        # out/lse give exact per-block gradients. The xla stand-in's VJP sums over the block only: local use.
        self.supports_ring_backward = implementation != "xla"

    @functools.cached_property
    def op(self):
        tokamax = _tokamax()
        from tokamax._src.ops.attention import api, base  # noqa: PLC0415

        if self.implementation == "xla":  # reference op + its residual-taking VJP: CPU-testable stand-in
            return base.DotProductAttention(vjp=base.DotProductAttentionVjp())
        key = {"mosaic": "mosaic_gpu", "triton": "triton"}[self.implementation]
        if key not in api.IMPLEMENTATIONS:
            raise AttentionNotSupportedError(
                f"tokamax {tokamax.__version__} has no {self.implementation!r} attention on this platform")
        return api.IMPLEMENTATIONS[key]

    def _mask_kwargs(self, q, k, q_seg, kv_seg, causal, scale):
        """tokamax kwargs expressing the mask, and the per-row exactness flag (None when always exact)."""
        from tokamax._src.ops.attention import base  # noqa: PLC0415

        t, s = q.shape[1], k.shape[1]
        scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
        if q_seg is None and (not causal or t == s):
            return dict(is_causal=bool(causal), logits_scale=scale), None
        if causal and t == s and q_seg is kv_seg:
            # Causal self-attention over contiguous segments: query i sees [start of its segment, i], so
            # only k_start is needed and tokamax keeps its causal fast path (block skipping in the backward
            # too, which it loses once the causal mask is folded into k_end).
            k_start, _, exact = segment_key_ranges(q_seg, kv_seg)
            return dict(mask=base.Mask(k_start=k_start[:, None, :], is_causal=True), logits_scale=scale), exact
        b = q.shape[0]
        k_start = jnp.zeros((b, t), jnp.int32)
        k_end = jnp.full((b, t), s, jnp.int32)
        exact = None
        if q_seg is not None:
            k_start, k_end, exact = segment_key_ranges(q_seg, kv_seg)
        if causal:  # aligned to the end of the keys, as in ops.attention
            k_end = jnp.minimum(k_end, jnp.arange(t, dtype=jnp.int32)[None] + (s - t + 1))
        # Shapes "*#B #h #T": one range per batch row and query, broadcast over heads.
        mask = base.Mask(k_start=k_start[:, None, :], k_end=k_end[:, None, :])
        return dict(mask=mask, logits_scale=scale), exact

    def fwd(self, q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None):
        kwargs, exact = self._mask_kwargs(q, k, q_segment_ids, kv_segment_ids, causal, scale)
        with _on_target():
            out, (m, l) = self.op(q, k, v, return_residuals=True, **kwargs)
        seen = l > 0
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf).astype(jnp.float32)
        if "mask" in kwargs and self.implementation == "xla":
            # Rows that see no key: the Mosaic/Triton kernels give 0, the xla stand-in a uniform average.
            out = jnp.where(seen.transpose(0, 2, 1)[..., None], out, jnp.zeros((), out.dtype))
        return _poison_unless(exact, out), _poison_unless(exact, lse)

    def bwd(self, q, k, v, out, lse, dout, *, q_segment_ids=None, kv_segment_ids=None, causal=True,
            scale=None):
        kwargs, exact = self._mask_kwargs(q, k, q_segment_ids, kv_segment_ids, causal, scale)
        bound = self.op.bind(q, k, v, **kwargs).kwargs
        bound = {name: val for name, val in bound.items() if name != "return_residuals"}
        # (m, l) = (lse, 1) reproduces p = exp(s - m) / l = exp(s - lse) with the global statistics.
        m = jnp.where(jnp.isneginf(lse), 0.0, lse).astype(jnp.float32)
        with _on_target():
            grads = self.op.vjp((m, jnp.ones_like(m)), out.astype(q.dtype), dout.astype(q.dtype), q, k, v, **bound)
        return tuple(_poison_unless(exact, grads[name]) for name in ("q", "k", "v"))


class HybridKernel(TokamaxKernel):
    """tokamax forward + cuDNN flash backward fed with tokamax's LSE (``impl="pallas"`` on Hopper+ GPUs).

    The backward is exact for any forward with the same statistics: cuDNN recomputes the probabilities
    from (q, k, lse) and delta from (out, dout). Cases cuDNN cannot take (segment ids, causal with T != S,
    fp32, ...) go to tokamax's own VJP, as does everything when ``ops.cudnn_flash`` is unavailable.
    ``implementation="xla"`` (tokamax's reference op) exists for CPU tests of the dispatch.
    """

    def __init__(self, implementation="mosaic"):
        super().__init__(implementation)
        self.name = f"pallas[{implementation}+cudnn-bwd]"
        if not cudnn_flash.available():
            logging.getLogger(__name__).warning(
                "JAX's private cuDNN attention API is unavailable (%s): impl='pallas' uses tokamax's own "
                "backward (slower)", cudnn_flash.UNAVAILABLE_REASON)

    def uses_cudnn_backward(self, q, k, q_segment_ids, causal):
        return cudnn_flash.supports(q, k, causal=causal, has_segment_ids=q_segment_ids is not None)

    def bwd(self, q, k, v, out, lse, dout, *, q_segment_ids=None, kv_segment_ids=None, causal=True,
            scale=None):
        if self.uses_cudnn_backward(q, k, q_segment_ids, causal):
            return cudnn_flash.flash_backward(q, k, v, out, lse, dout, causal=causal, scale=scale)
        if cudnn_packed.supports(q, k, q_segment_ids, kv_segment_ids, causal=causal):
            # Packed rows: cuDNN's ragged backward, tokamax's where a batch breaks its contract (lax.cond).
            fallback = functools.partial(super().bwd, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                         causal=causal, scale=scale)
            return cudnn_packed.flash_backward_packed(q, k, v, out, lse, dout, q_segment_ids, causal=causal,
                                                      scale=scale, fallback=fallback)
        return super().bwd(q, k, v, out, lse, dout, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                           causal=causal, scale=scale)


# -------------------------------------------------------------------------------------------- cuDNN


class CudnnKernel:
    """cuDNN flash attention: GQA, causal and causal sliding windows; no segment ids."""

    name = "cudnn"

    def __init__(self):
        # The private primitives give fp32 statistics and a backward from the global out/LSE (ring blocks).
        self.supports_ring_backward = cudnn_flash.available()
        if not cudnn_flash.available():
            slow_paths.report("cudnn_recompute_backward",
                              f"JAX's private cuDNN API is unavailable ({cudnn_flash.UNAVAILABLE_REASON}), so "
                              "impl='cudnn' differentiates by running the forward again", "use the jax version "
                              "pyproject.toml pins, or impl='pallas' (tokamax)")
        self._with_lse = lse_vjp_kernel(self.fwd, self.bwd if cudnn_flash.available() else self._bwd_recompute)

    @staticmethod
    def _check(q, k, q_seg, causal):
        if q_seg is not None:
            raise AttentionNotSupportedError(
                "impl='cudnn' cannot honour segment ids (packed rows); use impl='pallas' or 'xla'")
        if causal and q.shape[1] != k.shape[1]:
            raise AttentionNotSupportedError("impl='cudnn' causal attention needs T == S")

    @staticmethod
    def _jax_nn(q, k, v, causal, scale, window, **kw):
        # jax.nn's (left, right) window counts the keys before the query: W visible keys are (W - 1, 0).
        local = None if window is None else (int(window) - 1, 0)
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal, implementation="cudnn",
                                            local_window_size=local, **kw)

    def fwd(self, q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None, window=None):
        self._check(q, k, q_segment_ids, causal)
        if cudnn_flash.available():
            return cudnn_flash.flash_forward(q, k, v, causal=causal, scale=scale, **window_kwargs(window))
        out, lse = self._jax_nn(q, k, v, causal, scale, window, return_residual=True)
        return out, lse.transpose(0, 2, 1).astype(jnp.float32)  # [B, T, H], rounded to q's dtype by jax.nn

    def bwd(self, q, k, v, out, lse, dout, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None,
            window=None):
        if not cudnn_flash.available():
            raise AttentionNotSupportedError(
                "cuDNN's backward from the global softmax statistics needs JAX's private cuDNN API, which is "
                f"unavailable ({cudnn_flash.UNAVAILABLE_REASON}): ring attention cannot differentiate through "
                "cuDNN blocks; use impl='pallas' (tokamax) or 'xla'")
        self._check(q, k, q_segment_ids, causal)
        return cudnn_flash.flash_backward(q, k, v, out, lse, dout, causal=causal, scale=scale,
                                          **window_kwargs(window))

    def _bwd_recompute(self, q, k, v, out, lse, dout, *, q_segment_ids=None, kv_segment_ids=None, causal=True,
                       scale=None, window=None):
        # Only used for the local (non-ring) gradient, where out/lse are this call's own: re-run through
        # jax.nn's own VJP (correct for the output cotangent, which is all lse_vjp_kernel lets through).
        _, vjp = jax.vjp(lambda q, k, v: self._jax_nn(q, k, v, causal, scale, window), q, k, v)
        return vjp(dout)

    def attention(self, q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None, window=None):
        # Through the private primitives when present, as attention_with_lse: the forward's out and fp32 LSE carry
        # the checkpoint names remat's save_attention_out keeps, and no compile-time check of the host's own GPU
        # (jax.nn's caps head_dim at 128 unless the *local* device is a Hopper: a head_dim 256 program compiled
        # for h100 topologies from a CPU host was refused).
        if cudnn_flash.available():
            return self.attention_with_lse(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                           causal=causal, scale=scale, window=window)[0]
        self._check(q, k, q_segment_ids, causal)
        return self._jax_nn(q, k, v, causal, scale, window)

    def attention_with_lse(self, q, k, v, *, q_segment_ids=None, kv_segment_ids=None, causal=True, scale=None,
                           window=None):
        self._check(q, k, q_segment_ids, causal)
        return self._with_lse(q, k, v, None, None, bool(causal), scale, window)


# ------------------------------------------------------------------------------------------ registry


def hybrid_available(target=None) -> bool:
    """The ``pallas`` GPU kernel is the Mosaic + cuDNN-backward hybrid (Hopper+, tokamax, private cuDNN API) on
    ``target`` (default: the current mesh's devices, ``parallel.target``)."""
    target = target or target_of()
    return (target.is_gpu and target.compute_capability >= 9.0 and tokamax_available()
            and cudnn_flash.available())


def cudnn_window_available(target=None) -> bool:
    """cuDNN's sliding-window flash attention (``CudnnKernel`` with ``window=``) runs on ``target`` (default: the
    current mesh's devices): a Hopper+ GPU and JAX's private cuDNN API (forward and backward from fp32 statistics).
    """
    target = target or target_of()
    return target.is_gpu and target.compute_capability >= 9.0 and cudnn_flash.available()


def get_kernel(name, interpret=False, target=None):
    """Kernel object for ``cudnn`` / ``pallas`` / ``pallas-mosaic`` / ``pallas-triton`` / ``splash`` on ``target``
    (default: the devices of the current mesh, ``parallel.target``); raises if unavailable there.

    ``pallas`` on GPU: the hybrid (tokamax Mosaic forward + cuDNN backward) on Hopper+, tokamax Triton
    before; ``pallas-mosaic`` / ``pallas-triton``: tokamax alone (its own forward and backward). ``pallas`` on
    TPU and ``splash``: TPU splash attention; ``interpret=True`` (splash only) runs it in the Pallas
    interpreter on any backend.
    """
    target = target or target_of()
    return _kernel_for(name, bool(interpret), target.platform, target.compute_capability)


@functools.cache
def _kernel_for(name, interpret, backend, compute_capability):
    check_interpret(name, interpret)
    if name == "splash" or (name == "pallas" and backend == "tpu"):
        if backend != "tpu" and not interpret:
            raise AttentionNotSupportedError(f"impl='splash' needs a TPU (target is {backend!r}); interpret=True "
                                             "runs it in the Pallas interpreter (slow, for tests)")
        return SplashKernel(interpret=interpret)
    if name == "cudnn":
        if backend != "gpu":
            raise AttentionNotSupportedError(f"impl='cudnn' needs an NVIDIA GPU (target is {backend!r})")
        return CudnnKernel()
    if name in ("pallas", "pallas-mosaic", "pallas-triton"):
        if backend != "gpu":
            raise AttentionNotSupportedError(f"impl={name!r} needs a GPU{' or TPU' if name == 'pallas' else ''} "
                                             f"(target is {backend!r})")
        if not tokamax_available():
            raise AttentionNotSupportedError(f"impl={name!r} on GPU needs tokamax (pip install 'longrm_jax[gpu]')")
        if name == "pallas-triton" or (name == "pallas" and compute_capability < 9.0):
            return TokamaxKernel("triton")
        return HybridKernel("mosaic") if name == "pallas" else TokamaxKernel("mosaic")
    raise AttentionNotSupportedError(f"no accelerator kernel named {name!r}")
