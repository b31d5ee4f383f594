"""cuDNN's flash backward for packed rows (segment ids), through cuDNN's ragged ("packed", THD) layout.

Packed rows hold several sequences one after another (segment ids 1, 2, ..., 0 = padding, each a
contiguous run). cuDNN can run attention over such rows when it is told where each sequence starts and
how long it is: JAX's private fused-attention primitives take per-row ``q_seqlen``/``kv_seqlen`` [B, M]
and ``q_offsets``/``kv_offsets`` [B, M + 1] (M = the static maximum number of sequences per row, unused
entries -1) and turn them into cuDNN's ragged offsets. Attention is then causal *within* each sequence
and never computes the blocks across sequences, which tokamax's sm90 backward does (it only masks them).

What this module adds on top of ``ops.cudnn_flash``:

- ``segment_runs(segment_ids, max_runs)``: the runs of equal ids of each row (padding included: a run
  of zeros is a sequence of its own, which is exactly our mask, "padding attends only to padding"), as
  offsets and lengths in JAX's format, plus per-row flags: every id is one run (``contiguous``) and the
  row has at most ``max_runs`` runs (``fits``). Both are data, so they are checked on the device.
- ``packed_stats(lse, runs)``: the softmax statistics the ragged backward reads. In the ragged mode
  cuDNN's statistics tensor is [B * M, H, T] fp32: one dense [H, T] slab per sequence, the sequences of
  all rows numbered one after another (row 0's runs, then row 1's, ...: the order in which JAX packs the
  offsets), position t of a slab being the t-th token *of that sequence*. Our kernels' LSE is [B, H, T]
  by row position, so the backward scatters it into that layout. (Found by running cuDNN's packed
  forward and comparing its statistics with the LSE of each sequence: the probe of
  scripts/bench_packed_attention.py; max difference 1.9e-6 on an H200.)
- ``flash_backward_packed(...)``: cuDNN's backward in that layout from the given out and LSE (tokamax's
  forward, as in the ``pallas`` hybrid), with a device-side fallback: a batch where some row breaks the
  contract (more runs than ``max_runs``, or an id in two runs) takes the given fallback backward
  (tokamax's) for that call, chosen by ``lax.cond``, so nothing is ever computed with a wrong mask.

The static ``max_runs``: the trainer knows its batches (groups per row x sequences per group, plus one
run of padding) and says so with ``with max_segments_per_row(n): ...`` around the traced step; without
it ``DEFAULT_MAX_RUNS`` is used. Larger bounds cost a larger statistics tensor (M x the LSE) and more
empty work items in cuDNN's grid; a batch over the bound is still exact (fallback), only slower.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp

from longrm_jax.ops import cudnn_flash

DEFAULT_MAX_RUNS = 8
MIN_CUDNN_VERSION = 90600  # cuDNN's ragged offsets in the flash kernels (forward and backward)

_state = threading.local()


@contextlib.contextmanager
def max_segments_per_row(n: int):
    """Static bound on the runs of segment ids per row (sequences + padding) for attention traced inside."""
    n = int(n)
    if n < 1:
        raise ValueError(f"max_segments_per_row needs n >= 1, got {n}")
    previous = getattr(_state, "max_runs", None)
    _state.max_runs = n
    try:
        yield
    finally:
        _state.max_runs = previous


def max_runs() -> int:
    """The bound in effect: ``max_segments_per_row``'s, else ``DEFAULT_MAX_RUNS``."""
    n = getattr(_state, "max_runs", None)
    return DEFAULT_MAX_RUNS if n is None else n


def segment_runs(segment_ids, max_runs_per_row):
    """Runs of equal segment ids per row, in the format of JAX's packed cuDNN attention.

    ``segment_ids`` int [B, T]. Returns a dict of:
      ``offsets`` int32 [B, M + 1]: start of run m (m < runs), -1 after (JAX's ``q_offsets`` format);
      ``lengths`` int32 [B, M]: length of run m, -1 after (``q_seqlen``);
      ``runs`` int32 [B]: runs in the row; ``fits`` bool [B]: runs <= M;
      ``contiguous`` bool [B]: no id occurs in two runs (else the runs are not the segment mask);
      ``run_of_token`` int32 [B, T]: the run each token belongs to.
    M = ``max_runs_per_row``. Rows over M keep their first M runs in the arrays (their ``fits`` is False).
    """
    seg = segment_ids.astype(jnp.int32)
    b, t = seg.shape
    m = int(max_runs_per_row)
    starts = jnp.concatenate([jnp.ones((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    run_of_token = jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1
    runs = run_of_token[:, -1] + 1
    # First token of run j = number of tokens in runs < j (run_of_token is sorted along the row).
    ends = jax.vmap(lambda r: jnp.searchsorted(r, jnp.arange(1, m + 1, dtype=jnp.int32), side="left"))(
        run_of_token).astype(jnp.int32)  # [B, M]: end of run j (= T for j >= runs)
    begin = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), ends[:, :-1]], axis=1)
    used = jnp.arange(m, dtype=jnp.int32)[None, :] < runs[:, None]
    lengths = jnp.where(used, ends - begin, -1)
    offsets = jnp.concatenate([jnp.where(used, begin, -1), jnp.full((b, 1), -1, jnp.int32)], axis=1)
    # Contiguity among the runs that fit: the id of each run differs from every other run's id.
    run_ids = jnp.take_along_axis(seg, jnp.clip(begin, 0, t - 1), axis=1)
    same = (run_ids[:, :, None] == run_ids[:, None, :]) & used[:, :, None] & used[:, None, :]
    contiguous = jnp.sum(same, axis=(1, 2)) == runs.clip(max=m)
    return dict(offsets=offsets, lengths=lengths, runs=runs, fits=runs <= m, contiguous=contiguous,
                run_of_token=run_of_token)


def packed_stats(lse, runs_info, max_runs_per_row):
    """[B, H, T] LSE by row position -> cuDNN's ragged statistics [B * M, H, T] (see the module docstring).

    Slab s (the s-th run over all rows, in row order) is the window ``lse[b_s, :, o_s : o_s + T]`` of its
    row (zero past the row's end): one contiguous copy per slab. Entries past a run's length are never
    read by cuDNN; they are zeroed so the tensor is a function of the runs alone.
    """
    b, h, t = lse.shape
    m = int(max_runs_per_row)
    used = runs_info["lengths"] >= 0  # [B, M]
    # Slab order: the used runs of row 0, then of row 1, ... (JAX left-packs the offsets that way).
    slab = (jnp.cumsum(used.reshape(-1)) - 1).reshape(b, m)
    slot = jnp.where(used, slab, b * m)  # unused runs: dropped
    row_of_slab = jnp.zeros((b * m,), jnp.int32).at[slot].set(
        jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], (b, m)), mode="drop")
    start_of_slab = jnp.zeros((b * m,), jnp.int32).at[slot].set(runs_info["offsets"][:, :m], mode="drop")
    len_of_slab = jnp.zeros((b * m,), jnp.int32).at[slot].set(runs_info["lengths"], mode="drop")
    padded = jnp.pad(lse.astype(jnp.float32), ((0, 0), (0, 0), (0, t)))

    def window(row, start, length):
        w = jax.lax.dynamic_slice(padded[row], (0, start), (h, t))
        return jnp.where(jnp.arange(t)[None, :] < length, w, 0.0)

    return jax.vmap(window)(row_of_slab, start_of_slab, len_of_slab)


def _scatter_stats(lse, runs_info, max_runs_per_row):
    """Reference for ``packed_stats`` (tests): every token written to (its slab, its place in the run)."""
    b, h, t = lse.shape
    m = int(max_runs_per_row)
    run = runs_info["run_of_token"]
    first = jnp.cumsum(runs_info["runs"].clip(max=m)) - runs_info["runs"].clip(max=m)  # runs of earlier rows
    begin = jnp.take_along_axis(runs_info["offsets"][:, :m].clip(min=0), run.clip(max=m - 1), axis=1)
    slab = jnp.where(run < m, first[:, None] + run, b * m)  # runs past the bound: dropped
    local = jnp.arange(t, dtype=jnp.int32)[None, :] - begin
    stats = jnp.zeros((b * m, h, t), jnp.float32)
    return stats.at[slab, :, local].set(lse.astype(jnp.float32).transpose(0, 2, 1), mode="drop")


def unpack_stats(stats, runs_info, max_runs_per_row):
    """Inverse of ``packed_stats``: cuDNN's ragged statistics -> [B, H, T] by row position."""
    m = int(max_runs_per_row)
    run = runs_info["run_of_token"]
    b, t = run.shape
    first = jnp.cumsum(runs_info["runs"].clip(max=m)) - runs_info["runs"].clip(max=m)
    begin = jnp.take_along_axis(runs_info["offsets"][:, :m].clip(min=0), run.clip(max=m - 1), axis=1)
    slab = (first[:, None] + run).clip(max=b * m - 1)
    local = jnp.arange(t, dtype=jnp.int32)[None, :] - begin
    return stats[slab, :, local].transpose(0, 2, 1)  # [B, T, H] -> [B, H, T]


def supports(q, k, q_segment_ids, kv_segment_ids, *, causal, check_device=True) -> bool:
    """Whether ``flash_backward_packed`` computes this (segment-masked) attention's backward exactly."""
    if q_segment_ids is None or kv_segment_ids is not q_segment_ids:  # self-attention over one packing
        return False
    if q.shape[1] != k.shape[1]:
        return False
    if not cudnn_flash.supports(q, k, causal=causal, has_segment_ids=False, check_device=check_device):
        return False
    return not check_device or _cudnn_version_ok()


def _cudnn_version_ok() -> bool:
    try:
        return int(cudnn_flash._FA.check_cudnn_version()) >= MIN_CUDNN_VERSION
    except Exception:  # noqa: BLE001 - no cuDNN: not supported
        return False


def _params(q, causal, scale):
    fa = cudnn_flash._FA
    # Top-left causal per sequence = our causal mask within a segment (T == S per sequence).
    return dict(scale=float(q.shape[-1] ** -0.5 if scale is None else scale), seed=42, dropout_rate=0.0,
                variadic_args=(False, False), mask_type=fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK,
                layout=fa.AttentionLayout.BTNH.value, sliding_window_length=None)


def forward_packed(q, k, v, runs_info, *, causal=True, scale=None):
    """cuDNN's packed forward: ``(out [B,T,Hq,D], stats [B*M, Hq, T] ragged)``. Not differentiable (probe/tests)."""
    fa = cudnn_flash._FA
    unused = jnp.zeros(0, q.dtype)
    off, lens = runs_info["offsets"], runs_info["lengths"]
    out, stats = fa._dot_product_attention_fwd_p_wrapper.bind(
        q, k, v, unused, lens, lens, off, off, unused, unused, is_training=True, **_params(q, causal, scale))
    return out, stats


def backward_packed(q, k, v, out, lse, dout, runs_info, max_runs_per_row, *, causal=True, scale=None,
                    stats=None):
    """cuDNN's ragged backward from the given ``out`` and ``lse`` [B, Hq, T] (or ragged ``stats``)."""
    if stats is None:
        stats = packed_stats(lse, runs_info, max_runs_per_row)
    return ragged_backward(q, k, v, out.astype(q.dtype), stats, dout.astype(q.dtype), runs_info, causal=causal,
                           scale=scale)


def ragged_backward(q, k, v, out, stats, dout, runs_info, *, causal, scale):
    """The cuDNN call itself: ragged statistics [B * M, H, T] in, (dq, dk, dv) out."""
    fa = cudnn_flash._FA
    unused = jnp.zeros(0, q.dtype)
    off, lens = runs_info["offsets"], runs_info["lengths"]
    grads = fa._dot_product_attention_bwd_p_wrapper.bind(
        q, k, v, unused, lens, lens, off, off, unused, unused, stats, out, dout, **_params(q, causal, scale))
    return grads[0], grads[1], grads[2]


def flash_backward_packed(q, k, v, out, lse, dout, segment_ids, *, causal=True, scale=None, fallback=None,
                          max_runs_per_row=None):
    """dq, dk, dv of segment-masked attention by cuDNN's ragged backward; ``fallback`` where rows break it.

    ``fallback(q, k, v, out, lse, dout) -> (dq, dk, dv)`` runs instead (``lax.cond``) when some row has more
    runs than the bound or a segment id in two runs; without one, such a call returns NaN gradients.
    """
    m = max_runs() if max_runs_per_row is None else int(max_runs_per_row)
    info = segment_runs(segment_ids, m)
    ok = jnp.all(info["fits"] & info["contiguous"])

    def packed(q, k, v, out, lse, dout):
        return backward_packed(q, k, v, out, lse, dout, info, m, causal=causal, scale=scale)

    if fallback is None:
        grads = packed(q, k, v, out, lse, dout)
        return tuple(jnp.where(ok, g, jnp.asarray(jnp.nan, g.dtype)) for g in grads)
    return jax.lax.cond(ok, packed, fallback, q, k, v, out, lse, dout)
