"""Evaluation on a device mesh (8 fake CPU devices): rows over fsdp, tokens over seq with ring attention.

Results must equal the single-device ones: DisRM scores (zigzag order + host pooling index) and GRM greedy
tokens (ring-attention prefill into the KV cache, decode outside the mesh).
"""

import jax
import numpy as np
import pytest

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips

from longrm_jax import load_pretrained  # noqa: E402
from longrm_jax.evaluation.grm.generation import GreedyGenerator  # noqa: E402
from longrm_jax.evaluation.scoring import DisRMScorer, hf_pooled_index  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402
from longrm_jax.parallel.mesh import make_mesh  # noqa: E402


def test_hf_pooled_index():
    ids = np.array([[5, 6, 0, 0], [5, 0, 7, 9], [0, 0, 0, 0]])
    lengths = np.array([2, 4, 1])
    assert hf_pooled_index(ids, lengths, 0).tolist() == [1, 3, 0]
    assert hf_pooled_index(ids, lengths, None).tolist() == [1, 3, 0]
    assert hf_pooled_index(np.array([[5, 6, 9, 9]]), np.array([2]), 9).tolist() == [1]  # pads beyond the row


@pytest.mark.slow
def test_seq_mesh_matches_single_device(tmp_path):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, 250, n).astype(np.int32) for n in (70, 23, 41, 96, 12)]
    mesh = make_mesh(seq=2)  # fsdp fills the other 4 devices

    make_tiny_checkpoint(tmp_path / "rm", "qwen3", head="classifier", pad_token_id=0, layers=1)
    rm = load_pretrained(tmp_path / "rm", dtype="float32")
    single = DisRMScorer(rm, 0, batch_size=4).score(prompts, progress=False)
    rm_sharded = load_pretrained(tmp_path / "rm", dtype="float32", mesh=mesh)
    sharded = DisRMScorer(rm_sharded, 0, batch_size=4, mesh=mesh)
    assert not sharded.self_pooling
    np.testing.assert_allclose(sharded.score(prompts, progress=False), single, rtol=1e-4, atol=1e-6)
    fsdp_mesh = make_mesh()  # all 8 devices on fsdp: rows split, the classifier pools by itself
    rm_fsdp = load_pretrained(tmp_path / "rm", dtype="float32", mesh=fsdp_mesh)
    scorer = DisRMScorer(rm_fsdp, 0, batch_size=4, mesh=fsdp_mesh)
    assert scorer.self_pooling
    np.testing.assert_allclose(scorer.score(prompts, progress=False), single, rtol=1e-4, atol=1e-6)

    make_tiny_checkpoint(tmp_path / "lm", "llama", pad_token_id=0, layers=1)
    lm = load_pretrained(tmp_path / "lm", dtype="float32")
    kwargs = dict(pad_id=0, stop_ids=[1], max_new_tokens=12, letter_ids=[37, 38], batch_size=4)
    single = GreedyGenerator(lm, **kwargs).generate(prompts, progress=False)
    lm_sharded = load_pretrained(tmp_path / "lm", dtype="float32", mesh=mesh)
    generator = GreedyGenerator(lm_sharded, mesh=mesh, **kwargs)
    sharded = generator.generate(prompts, progress=False)
    # The prefilled cache is spread over the seq devices (what lets a context exceed one device's memory).
    from longrm_jax.evaluation.batching import Batch, pad_rows
    from longrm_jax.evaluation.scoring import place_batch

    ids, lengths = pad_rows(prompts, Batch(128, 4, (0, 1, 2, 3)), 0)
    inputs = [place_batch(a, mesh) for a in generator._prefill_inputs(ids, lengths)]
    with jax.set_mesh(mesh):
        cache, _, _ = generator._prefill_fn(128 + 12)(lm_sharded, *inputs, generator.letter_ids)
    assert cache.k.sharding.spec[2] == "seq" and cache.k.sharding.spec[1] == "fsdp"
    for ours, reference in zip(sharded, single):
        np.testing.assert_array_equal(ours.tokens, reference.tokens)
        np.testing.assert_allclose(ours.letter_logprobs, reference.letter_logprobs, rtol=1e-4, atol=1e-5)
