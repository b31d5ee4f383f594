"""cuDNN's ragged (packed-row) backward behind the `pallas` hybrid, checked on CPU.

cuDNN cannot run here. Checked: the runs/offsets/lengths derived from segment ids (padding, overflow of
the static bound, an id in two runs), the statistics layout conversion (against a token-by-token scatter
and its inverse), the lowering to cuDNN's custom call, the dispatch of the hybrid's backward with a
stand-in for the cuDNN call that reads the ragged statistics the way cuDNN does (layout confirmed on an
H200 by scripts/bench_packed_attention.py's probe), the choice among views of the row, and the fallback
to tokamax's backward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longrm_jax.ops import cudnn_flash, cudnn_packed, dense_reference, flash
from longrm_jax.ops.xla_attention import xla_attention_bwd, xla_attention_with_lse

B, T, HQ, HKV, D = 2, 64, 8, 2, 16


def _seg(*rows):
    out = []
    for lengths in rows:
        row = []
        for i, n in enumerate(lengths):
            row += [i + 1] * n
        out.append(row + [0] * (T - len(row)))
    return jnp.asarray(np.array(out, np.int32))


def test_runs_offsets_and_lengths_follow_jax_packed_format():
    seg = jnp.asarray(np.array([[1] * 5 + [2] * 7 + [0] * 4, [3] * 10 + [0] * 6, [1] * 16], np.int32))
    info = cudnn_packed.segment_runs(seg, 4)  # the whole-row view
    np.testing.assert_array_equal(info["offsets"], [[0, 5, 12, -1, -1], [0, 10, -1, -1, -1], [0, -1, -1, -1, -1]])
    np.testing.assert_array_equal(info["lengths"], [[5, 7, 4, -1], [10, 6, -1, -1], [16, -1, -1, -1]])
    assert int(info["runs"]) == 6 and bool(info["ok"])
    np.testing.assert_array_equal(info["start"][:6], [0, 5, 12, 16, 26, 32])
    np.testing.assert_array_equal(info["run_of_token"][1], [3] * 10 + [4] * 6)


def test_overflow_and_split_segments_are_flagged():
    seg = jnp.asarray(np.array([[1, 1, 2, 2, 3, 3, 0, 0], [1, 1, 2, 2, 1, 1, 0, 0]], np.int32))
    assert not bool(cudnn_packed.segment_runs(seg[:1], 3)["ok"])  # 4 runs in a row, bound 3
    assert bool(cudnn_packed.segment_runs(seg[:1], 4)["ok"])
    assert not bool(cudnn_packed.segment_runs(seg, 4)["ok"])  # id 1 starts two runs of row 1


def test_views_place_runs_where_they_start_and_may_cross_view_rows(monkeypatch):
    """A 2 x 30 pair + padding in a 64-token row, bound 2: the whole row holds 3 starts (no); half rows of 32
    hold (0, 30) and (60) with the second run crossing into the second half (yes); quarters are too short."""
    monkeypatch.setattr(cudnn_packed, "MIN_VIEW_LEN", 8)
    seg = jnp.asarray(np.array([[1] * 30 + [2] * 30 + [0] * 4], np.int32))
    assert cudnn_packed.view_lengths(64) == [64, 32, 16, 8]
    views = {L: cudnn_packed.view_runs(seg, L, 2) for L in (64, 32, 16)}
    assert [bool(v["ok"]) for v in views.values()] == [False, True, False]
    np.testing.assert_array_equal(views[32]["offsets"], [[0, 30, -1], [28, -1, -1]])
    np.testing.assert_array_equal(views[32]["lengths"], [[30, 30], [4, -1]])
    assert cudnn_packed.view_lengths(128_000) == [128_000, 64_000, 32_000, 16_000, 8_000, 4_000, 2_000]


@pytest.mark.parametrize("view_len,bound", [(T, 4), (T, 9), (32, 3), (32, 4)])
def test_statistics_layout_is_one_slab_per_run_in_run_order(view_len, bound):
    seg = _seg([20, 30], [10, 10, 30], [32, 32])
    info = cudnn_packed.view_runs(seg, view_len, bound)
    assert bool(info["ok"])
    lse = jax.random.normal(jax.random.key(0), (3, 4, T))
    stats = cudnn_packed.packed_stats(lse, info)
    assert stats.shape == (3 * T // view_len * bound, 4, view_len)
    np.testing.assert_array_equal(stats, cudnn_packed._scatter_stats(lse, info))
    np.testing.assert_array_equal(cudnn_packed.unpack_stats(stats, info), lse)
    if view_len == T:  # row 1's second run (tokens 10..19) is slab 3 + 1 (row 0: two samples and padding)
        np.testing.assert_array_equal(stats[4, :, :10], lse[1, :, 10:20])
        assert float(jnp.abs(stats[4, :, 10:]).max()) == 0.0


def test_bound_context_nests_and_validates():
    assert cudnn_packed.max_runs() == cudnn_packed.DEFAULT_MAX_RUNS
    with cudnn_packed.max_segments_per_row(3):
        with cudnn_packed.max_segments_per_row(17):
            assert cudnn_packed.max_runs() == 17
        assert cudnn_packed.max_runs() == 3
    assert cudnn_packed.max_runs() == cudnn_packed.DEFAULT_MAX_RUNS
    with pytest.raises(ValueError, match="n >= 1"), cudnn_packed.max_segments_per_row(0):
        pass


def test_supports_self_attention_packing_only():
    q = jnp.zeros((B, T, HQ, D), jnp.bfloat16)
    k = jnp.zeros((B, T, HKV, D), jnp.bfloat16)
    seg = _seg([20, 30], [64])
    ok = dict(causal=True, check_device=False)
    assert cudnn_packed.supports(q, k, seg, seg, **ok)
    assert not cudnn_packed.supports(q, k, seg, seg, causal=True)  # CPU: no cuDNN
    assert not cudnn_packed.supports(q, k, None, None, **ok)
    assert not cudnn_packed.supports(q, k, seg, jnp.array(seg), **ok)  # a different kv packing (ring blocks)
    assert not cudnn_packed.supports(q[:, :32], k, seg[:, :32], seg[:, :32], **ok)
    assert not cudnn_packed.supports(q.astype(jnp.float32), k.astype(jnp.float32), seg, seg, **ok)


def test_backward_lowers_to_cudnn_ragged_custom_call():
    q = jax.ShapeDtypeStruct((B, T, HQ, D), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, T, HKV, D), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((B, HQ, T), jnp.float32)
    seg = jax.ShapeDtypeStruct((B, T), jnp.int32)

    def f(q, k, v, out, lse, dout, seg):
        return cudnn_packed.flash_backward_packed(q, k, v, out, lse, dout, seg, max_runs_per_row=3)

    grads = jax.eval_shape(f, q, kv, kv, q, lse, q, seg)
    assert [(g.shape, g.dtype) for g in grads] == [(q.shape, q.dtype), (kv.shape, kv.dtype), (kv.shape, kv.dtype)]
    text = jax.jit(f).trace(q, kv, kv, q, lse, q, seg).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @__cudnn$fmhaSoftmaxBackward" in line]
    views = cudnn_packed.view_lengths(T)
    assert len(calls) == len(views)  # one call per view (lax.switch); the first holding the batch runs
    for call, view_len in zip(calls, views):
        assert "max_seg_per_batch\\22: 3" in call  # the static bound reaches cuDNN's config
        assert call.count("%") - call.split("(")[0].count("%") == 10  # q k v stats dO O 2 x seqlen 2 x offsets
        # Statistics (and cuDNN's workspace) scale with bound x B x T in every view: one [H, L] slab per place.
        assert f"tensor<{B * T // view_len * 3}x{HQ}x{view_len}xf32>" in call


def _fake_ragged(q, k, v, out, stats, dout, info, *, causal, scale):
    """cuDNN's ragged backward emulated: reads slab s at (run s, position in run), runs as segments."""
    _fake_ragged.calls += 1
    lse = cudnn_packed.unpack_stats(stats, info)
    runs = info["run_of_token"]
    return xla_attention_bwd(q, k, v, out, lse, dout, q_segment_ids=runs, kv_segment_ids=runs, causal=causal,
                             scale=scale)


@pytest.fixture()
def fake_packed(monkeypatch):
    flash._tokamax()  # as the library imports it (xprof stand-in included): never a skip, in any test order
    _fake_ragged.calls = 0
    monkeypatch.setattr(cudnn_packed, "ragged_backward", _fake_ragged)
    # fp32 inputs (exact comparisons): accept them as cuDNN would bf16; the dense path stays off.
    monkeypatch.setattr(cudnn_packed, "supports", lambda q, k, q_seg, kv_seg, *, causal, **_: q_seg is not None
                        and kv_seg is q_seg and q.shape[1] == k.shape[1])
    monkeypatch.setattr(cudnn_flash, "supports", lambda q, k, *, causal, has_segment_ids, **_: False)
    return _fake_ragged


def _inputs():
    kq, kk, kv, kw = jax.random.split(jax.random.key(4), 4)
    return (jax.random.normal(kq, (B, T, HQ, D)), jax.random.normal(kk, (B, T, HKV, D)),
            jax.random.normal(kv, (B, T, HKV, D)), jax.random.normal(kw, (B, T, HQ, D)))


def _grads(q, k, v, w, seg, bound=None):
    kernel = flash.HybridKernel("xla")

    def loss(q, k, v):
        return jnp.sum(kernel.attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg) * w)

    ctx = cudnn_packed.max_segments_per_row(bound) if bound else jax.named_scope("default_bound")
    with ctx:  # active while the backward is traced
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)


def _want(q, k, v, w, seg):
    return jax.grad(lambda *a: jnp.sum(dense_reference(*a, segment_ids=seg) * w), argnums=(0, 1, 2))(q, k, v)


def rel_err(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def test_hybrid_backward_on_packed_rows_takes_the_ragged_path(fake_packed):
    q, k, v, w = _inputs()
    seg = _seg([20, 30], [10, 10, 30])
    w = jnp.where((seg > 0)[..., None, None], w, 0.0)  # padding carries no loss, as in training
    got = _grads(q, k, v, w, seg)
    for g, r in zip(got, _want(q, k, v, w, seg)):
        assert rel_err(g, r) < 1e-5
    for g in got:  # padding rows: exactly zero gradients
        assert float(jnp.abs(jnp.where((seg == 0)[..., None, None], g, 0.0)).max()) == 0.0
    assert fake_packed.calls == 1


@pytest.mark.parametrize("seg_rows", [([8, 8, 8, 8], [64]), "split"])
def test_rows_breaking_the_contract_fall_back_to_tokamax(fake_packed, seg_rows):
    """4 samples + padding = 5 runs > bound 3, or an id in two runs: tokamax's backward, still exact."""
    q, k, v, w = _inputs()
    if seg_rows == "split":
        seg = jnp.asarray(np.array([[1] * 16 + [2] * 16 + [1] * 16 + [0] * 16, [1] * 64], np.int32))
    else:
        seg = _seg(*seg_rows)
    got = _grads(q, k, v, w, seg, bound=3 if seg_rows != "split" else 8)
    if seg_rows == "split":  # tokamax's key ranges cannot express it either: NaN, never a wrong number
        assert bool(jnp.all(jnp.isnan(got[0][0]))) and bool(jnp.all(jnp.isfinite(got[0][1])))
        return
    for g, r in zip(got, _want(q, k, v, w, seg)):
        assert rel_err(g, r) < 1e-5
    assert fake_packed.calls == 1  # traced (the cond's other branch); exact only because the fallback ran


def test_a_half_row_view_computes_the_backward_when_the_whole_row_cannot(fake_packed, monkeypatch):
    """Bound 2: row 0 (30 + 30 + padding) has 3 starts, row 1 (3 x 20 + padding) 4, so only half-row views hold
    them (runs crossing into the next view row). No fallback is given: a batch no view held would be NaN."""
    monkeypatch.setattr(cudnn_packed, "MIN_VIEW_LEN", 8)
    q, k, v, w = _inputs()
    seg = _seg([30, 30], [20, 20, 20])
    out, lse = xla_attention_with_lse(q, k, v, q_segment_ids=seg, kv_segment_ids=seg)
    got = jax.jit(lambda *a: cudnn_packed.flash_backward_packed(*a, seg, max_runs_per_row=2))(q, k, v, out, lse, w)
    want = xla_attention_bwd(q, k, v, out, lse, w, q_segment_ids=seg, kv_segment_ids=seg, causal=True, scale=None)
    for g, r in zip(got, want):
        assert rel_err(g, r) < 1e-5
    assert fake_packed.calls == len(cudnn_packed.view_lengths(T))  # every view traced, one ran
