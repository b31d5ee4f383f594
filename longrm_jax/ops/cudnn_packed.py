"""cuDNN's flash backward for packed rows (segment ids), through cuDNN's ragged ("packed", THD) layout.

Packed rows hold several sequences one after another (segment ids 1, 2, ..., 0 = padding, each a
contiguous run). cuDNN can run attention over such rows when it is told where each sequence starts and
how long it is: JAX's private fused-attention primitives take ``q_seqlen``/``kv_seqlen`` [V, M] and
``q_offsets``/``kv_offsets`` [V, M + 1] for q/k/v of shape [V, L, H, D] (at most M sequences starting in each
of the V rows of length L, unused entries -1) and turn them into cuDNN's ragged offsets. Attention is then
causal *within* each sequence and never computes the blocks across sequences, which tokamax's sm90 backward
does (it only masks them).

**Views.** cuDNN sizes its backward workspace by the slabs it could be given: about 32 KB per (slab x L)
token, V * M slabs of L tokens each (32 query heads of 128: a 64K-token row with M = 8 takes 17.1 GiB of
temporaries, two 32K rows without packing 3.0; docs/packed_attention.md, "How the backward is fed"). So the
bound M must stay small whatever a row holds. The backward therefore looks at the batch through a *view*: the
[B, T] tokens as V = B * T / L rows of L tokens (a free reshape), L = T / 2^j. A run is placed in the view row
where it starts, at its offset there; it may run on past that view row's end (cuDNN addresses sequences by flat
offset). A view works when every run is at most L long and no view row holds more than M starts; the first view
that works (j = 0, 1, ...) is taken, on the device (``lax.switch``), and rows no view can hold take the fallback
(tokamax's backward). The workspace is M x B x T x 32 KB in every view: M = ``DEFAULT_MAX_RUNS`` (4) costs
twice the unpacked rows' workspace at most.

- ``view_runs(segment_ids, view_len, max_starts)``: the runs of equal ids of the rows (padding included: a
  run of zeros is a sequence of its own, which is exactly our mask, "padding attends only to padding"), placed
  in the view, in JAX's offsets/lengths format, and whether the view holds them all (``ok``, with the check
  that every id is one run of its row: otherwise runs are not the segment mask).
- ``packed_stats(lse, runs)``: the softmax statistics the ragged backward reads: [V * M, H, L] fp32, one dense
  [H, L] slab per run in run order, position t of a slab being the t-th token *of that run* (found by running
  cuDNN's packed forward and comparing its statistics with each sequence's LSE: the probe of
  scripts/bench_packed_attention.py, max difference 1.9e-6; docs/packed_attention.md). Our kernels' LSE is
  [B, H, T] by row position, so the backward copies one window per run.
- ``flash_backward_packed(...)``: cuDNN's backward in the first view that holds the batch, from the given out
  and LSE (tokamax's forward, as in the ``pallas`` hybrid), else the given fallback backward (tokamax's), so
  nothing is ever computed with a wrong mask.

``with max_segments_per_row(n): ...`` around the traced backward changes M (larger: more rows take cuDNN, more
workspace; the bench script's ``--bounds`` measures the slack).
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp

from longrm_jax.ops import cudnn_flash, slow_paths

DEFAULT_MAX_RUNS = 4  # sequence starts per view row (M)
MAX_VIEW_HALVINGS = 6  # views L = T, T/2, ..., T/64 (while L divides evenly and stays >= MIN_VIEW_LEN)
MIN_VIEW_LEN = 256
MIN_CUDNN_VERSION = 90600  # cuDNN's ragged offsets in the flash kernels (forward and backward)

_state = threading.local()


@contextlib.contextmanager
def max_segments_per_row(n: int):
    """Static bound M on the sequence starts per view row for attention backwards traced inside."""
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


def view_lengths(t: int) -> list[int]:
    """The view row lengths tried for rows of ``t`` tokens, longest first."""
    out = [t]
    while len(out) <= MAX_VIEW_HALVINGS and out[-1] % 2 == 0 and out[-1] // 2 >= MIN_VIEW_LEN:
        out.append(out[-1] // 2)
    return out


def flat_runs(segment_ids, capacity):
    """The first ``capacity`` runs of equal ids over the rows in flat (row-major) order: ``start``, ``length``
    int32 [capacity] (zeros past the last run), ``runs`` (how many there are), ``contiguous`` (no id starts two
    runs of one row: otherwise runs are not the segment mask) and ``run_of_token`` int32 [B, T]."""
    seg = segment_ids.astype(jnp.int32)
    b, t = seg.shape
    starts_bt = jnp.concatenate([jnp.ones((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)  # row starts too
    run_flat = jnp.cumsum(starts_bt.reshape(-1), dtype=jnp.int32) - 1  # [B*T], sorted
    runs = run_flat[-1] + 1
    idx = jnp.arange(capacity, dtype=jnp.int32)
    used = idx < runs
    start = jnp.where(used, jnp.searchsorted(run_flat, idx, side="left"), 0).astype(jnp.int32)
    end = jnp.searchsorted(run_flat, idx, side="right").astype(jnp.int32)
    length = jnp.where(used, end - start, 0)
    first_id, row_of = seg.reshape(-1)[start], start // t
    same = (first_id[:, None] == first_id[None, :]) & (row_of[:, None] == row_of[None, :])
    contiguous = jnp.sum(same & used[:, None] & used[None, :]) == jnp.minimum(runs, capacity)
    return dict(start=start, length=length, runs=runs, contiguous=contiguous, run_of_token=run_flat.reshape(b, t))


def view_runs(segment_ids, view_len, max_starts, runs=None):
    """Runs of equal segment ids of each row, placed in the [B * T / L, L] view (L = ``view_len``).

    ``segment_ids`` int [B, T]; ``runs``: ``flat_runs`` of them with at least V * M entries (computed when
    None). Returns ``flat_runs``' arrays cut to V * M entries (slab order = run order) and:
      ``offsets`` int32 [V, M + 1] (JAX's ``q_offsets``: start of each run within its view row, -1 after),
      ``lengths`` int32 [V, M] (``q_seqlen``, -1 when unused), with V = B * T / L and M = ``max_starts``;
      ``ok`` bool: the view holds every run (at most M starts per view row, each run at most L long) and the
      runs are the segment mask (``contiguous``); ``view_len``: L.
    """
    b, t = segment_ids.shape
    L, m = int(view_len), int(max_starts)
    if t % L:
        raise ValueError(f"view rows of {L} tokens do not divide rows of {t}")
    v = b * t // L
    cap = v * m
    runs = flat_runs(segment_ids, cap) if runs is None else runs
    start, length = runs["start"][:cap], runs["length"][:cap]
    idx = jnp.arange(cap, dtype=jnp.int32)
    used = idx < runs["runs"]
    vrow = jnp.where(used, start // L, v)  # sorted: runs are in flat order, unused entries last
    rank = idx - jnp.searchsorted(vrow, vrow, side="left").astype(jnp.int32)
    slot = jnp.where(used & (rank < m), vrow * m + rank, cap)
    lengths = jnp.full((cap,), -1, jnp.int32).at[slot].set(length, mode="drop").reshape(v, m)
    offsets = jnp.full((cap,), -1, jnp.int32).at[slot].set(start - vrow * L, mode="drop").reshape(v, m)
    offsets = jnp.concatenate([offsets, jnp.full((v, 1), -1, jnp.int32)], axis=1)
    fits = (runs["runs"] <= cap) & jnp.all(~used | ((rank < m) & (length <= L)))
    return dict(offsets=offsets, lengths=lengths, start=start, length=length, runs=runs["runs"],
                ok=fits & runs["contiguous"], run_of_token=runs["run_of_token"], view_len=L)


def segment_runs(segment_ids, max_runs_per_row):
    """``view_runs`` in the whole-row view (L = T): offsets/lengths per row, at most M runs per row."""
    return view_runs(segment_ids, segment_ids.shape[1], max_runs_per_row)


def packed_stats(lse, runs_info):
    """[B, H, T] LSE by row position -> cuDNN's ragged statistics [V * M, H, L] (see the module docstring).

    Slab s is the window ``L`` tokens long of the flat LSE at run s's start (zero past the run's length, which
    cuDNN never reads: the tensor is a function of the runs alone).
    """
    b, h, t = lse.shape
    L = runs_info["view_len"]
    flat = jnp.pad(lse.astype(jnp.float32).transpose(1, 0, 2).reshape(h, b * t), ((0, 0), (0, L)))

    def window(start, length):
        w = jax.lax.dynamic_slice(flat, (0, start), (h, L))
        return jnp.where(jnp.arange(L)[None, :] < length, w, 0.0)

    return jax.vmap(window)(runs_info["start"], runs_info["length"])


def _scatter_stats(lse, runs_info):
    """Reference for ``packed_stats`` (tests): every token written to (its slab, its place in the run)."""
    b, h, t = lse.shape
    L = runs_info["view_len"]
    run = runs_info["run_of_token"]
    local = jnp.arange(b * t, dtype=jnp.int32).reshape(b, t) - runs_info["start"][run.clip(max=run.size)]
    stats = jnp.zeros((runs_info["start"].shape[0], h, L), jnp.float32)
    return stats.at[run, :, local].set(lse.astype(jnp.float32).transpose(0, 2, 1), mode="drop")


def unpack_stats(stats, runs_info):
    """Inverse of ``packed_stats``: cuDNN's ragged statistics -> [B, H, T] by row position."""
    run = runs_info["run_of_token"]
    b, t = run.shape
    slab = run.clip(max=stats.shape[0] - 1)
    local = jnp.arange(b * t, dtype=jnp.int32).reshape(b, t) - runs_info["start"][slab]
    return stats[slab, :, local.clip(0, stats.shape[-1] - 1)].transpose(0, 2, 1)  # [B, T, H] -> [B, H, T]


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
    """cuDNN is new enough for the ragged backward; when not (or the check fails), one slow-path warning: packed
    rows then take the recomputing backward."""
    try:
        version = int(cudnn_flash._FA.check_cudnn_version())
    except Exception as e:  # noqa: BLE001 - no usable cuDNN: not supported, said once
        reason = f"the cuDNN version check failed ({type(e).__name__}: {e})"
    else:
        if version >= MIN_CUDNN_VERSION:
            return True
        reason = f"cuDNN {version} is older than the {MIN_CUDNN_VERSION} the ragged backward needs"
    slow_paths.report("cudnn_ragged_backward", f"{reason}, so packed rows use the recomputing attention backward",
                      "install the cuDNN that the jax CUDA plugin pins (pip install \"longrm_jax[gpu]\")")
    return False


def _params(q, causal, scale):
    fa = cudnn_flash._FA
    # Top-left causal per sequence = our causal mask within a segment (T == S per sequence).
    return dict(scale=float(q.shape[-1] ** -0.5 if scale is None else scale), seed=42, dropout_rate=0.0,
                variadic_args=(False, False), mask_type=fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK,
                layout=fa.AttentionLayout.BTNH.value, sliding_window_length=None)


def _to_view(x, view_len):
    """[B, T, ...] -> [B * T / L, L, ...]: the same buffer seen as rows of ``view_len`` tokens."""
    return x.reshape(x.shape[0] * x.shape[1] // view_len, view_len, *x.shape[2:])


def forward_packed(q, k, v, runs_info, *, causal=True, scale=None):
    """cuDNN's packed forward: ``(out [B,T,Hq,D], stats [V*M, Hq, L] ragged)``. Not differentiable (probe/tests)."""
    fa = cudnn_flash._FA
    unused = jnp.zeros(0, q.dtype)
    off, lens, L = runs_info["offsets"], runs_info["lengths"], runs_info["view_len"]
    out, stats = fa._dot_product_attention_fwd_p_wrapper.bind(
        _to_view(q, L), _to_view(k, L), _to_view(v, L), unused, lens, lens, off, off, unused, unused,
        is_training=True, **_params(q, causal, scale))
    return out.reshape(q.shape), stats


def backward_packed(q, k, v, out, lse, dout, runs_info, *, causal=True, scale=None, stats=None):
    """cuDNN's ragged backward from the given ``out`` and ``lse`` [B, Hq, T] (or ragged ``stats``)."""
    if stats is None:
        stats = packed_stats(lse, runs_info)
    return ragged_backward(q, k, v, out.astype(q.dtype), stats, dout.astype(q.dtype), runs_info, causal=causal,
                           scale=scale)


def ragged_backward(q, k, v, out, stats, dout, runs_info, *, causal, scale):
    """The cuDNN call itself, in the view of ``runs_info``: ragged statistics [V * M, H, L] in, (dq, dk, dv) out."""
    fa = cudnn_flash._FA
    unused = jnp.zeros(0, q.dtype)
    off, lens, L = runs_info["offsets"], runs_info["lengths"], runs_info["view_len"]
    grads = fa._dot_product_attention_bwd_p_wrapper.bind(
        *(_to_view(x, L) for x in (q, k, v)), unused, lens, lens, off, off, unused, unused, stats,
        _to_view(out, L), _to_view(dout, L), **_params(q, causal, scale))
    return grads[0].reshape(q.shape), grads[1].reshape(k.shape), grads[2].reshape(v.shape)


def flash_backward_packed(q, k, v, out, lse, dout, segment_ids, *, causal=True, scale=None, fallback=None,
                          max_runs_per_row=None):
    """dq, dk, dv of segment-masked attention by cuDNN's ragged backward; ``fallback`` where no view holds the
    rows (see the module docstring). ``fallback(q, k, v, out, lse, dout) -> (dq, dk, dv)``; without one, such a
    call returns NaN gradients."""
    m = max_runs() if max_runs_per_row is None else int(max_runs_per_row)
    lengths = view_lengths(segment_ids.shape[1])
    b, t = segment_ids.shape
    runs = flat_runs(segment_ids, b * t // lengths[-1] * m)  # enough entries for the view with most rows
    views = [view_runs(segment_ids, L, m, runs) for L in lengths]
    ok = jnp.stack([info["ok"] for info in views])
    # The first view that holds the batch; len(views) (the fallback) when none does.
    choice = jnp.where(jnp.any(ok), jnp.argmax(ok), len(views)).astype(jnp.int32)

    def in_view(info):
        return lambda q, k, v, out, lse, dout: backward_packed(q, k, v, out, lse, dout, info, causal=causal,
                                                                scale=scale)

    def poisoned(q, k, v, out, lse, dout):
        return tuple(jnp.full(x.shape, jnp.nan, x.dtype) for x in (q, k, v))

    branches = [in_view(info) for info in views] + [fallback or poisoned]
    return jax.lax.switch(choice, branches, q, k, v, out, lse, dout)
