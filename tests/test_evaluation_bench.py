"""scripts/bench_eval.py --smoke runs every part (ours, the PyTorch peer, decode) and reports a table."""

import importlib.util
import os

import pytest

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_eval.py")


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_eval", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_forward_flops_per_token_qwen3_8b_32k():
    """docs/flops.md by hand for Qwen3-8B as a classifier at S = 32768:
    N = 36 * (4096*32*128*2 + 4096*8*128*2 + 3*4096*12288) + 4096*1 = 6,945,771,520 (no embedding);
    forward = 2 N + 2 * 36 * 32 * 128 * 32768 = 13,891,543,040 + 9,663,676,416 = 23,555,219,456 (~23.6 GFLOP);
    the attention term is not halved a second time."""
    from longrm_jax.models import ModelConfig
    from longrm_jax.training.model_setup import PRESETS

    bench = _load_bench()
    cfg = ModelConfig(**PRESETS["qwen3_8b"]).replace(head="classifier", num_labels=1)
    assert bench.forward_flops_per_token(cfg, "classifier", 32_768) == pytest.approx(23_555_219_456, rel=1e-12)


@pytest.mark.slow
def test_bench_eval_smoke(capsys):
    bench = _load_bench()
    assert bench.main(["--smoke", "--lengths", "128", "--sequences", "1", "--decode-context", "64",
                       "--decode-steps", "4", "--no-record"]) == 0
    out = capsys.readouterr().out
    assert "| 128 | 1 |" in out and "failed" not in out and "GRM greedy decode" in out


@pytest.mark.slow
def test_decode_prefill_into_cache_rows_gives_the_same_tokens(capsys):
    """--decode-prefill-rows 1 writes each row's prefill straight into its row of the batch's cache (how a 2 x 128K
    batch fits an H100); the greedy tokens equal those of the whole batch prefilled at once, and of 2-row parts."""
    import json

    bench = _load_bench()
    digests = {}
    for rows in (1, 2, 4):
        capsys.readouterr()
        assert bench.main(["--smoke", "--part", "decode-jax", "--decode-context", "48", "--decode-steps", "6",
                           "--decode-batch", "4", "--decode-prefill-rows", str(rows), "--warmup", "0"]) == 0
        out = capsys.readouterr().out
        result = json.loads(out.split(bench.RESULT_TAG, 1)[1])
        assert result["decode_tokens"] == 4 * 5
        digests[rows] = result["tokens_digest"]
    assert digests[1] == digests[2] == digests[4], digests
