"""Evaluator vs transformers on tiny random checkpoints (fp32): DisRM scores and GRM greedy generations."""


import numpy as np
import pytest

import torch  # the test extra installs it: a broken install fails the run, never skips

from longrm_jax import load_pretrained  # noqa: E402
from longrm_jax.evaluation.encoding import disrm_sequences, load_chat_tokenizers  # noqa: E402
from longrm_jax.evaluation.grm.generation import GreedyGenerator  # noqa: E402
from longrm_jax.evaluation.samples import load_task_file  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_model_dir  # noqa: E402

VOCAB = 650  # the tiny tokenizer's size; pad 0, eos 2
NEW_TOKENS = 64


def _checkpoint(root, name, family, head):
    path = root / name
    return path, make_tiny_model_dir(path, family, head, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("ckpt"), "llama_rm", "llama", "classifier")


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("ckpt"), "qwen3_grm", "qwen3", "causal_lm")


def test_disrm_scores_match_transformers(classifier, tmp_path):
    from longrm_jax.evaluation.scoring import DisRMScorer

    path, ref = classifier
    rows = [dict(id=i, prompt_template=[{"role": "user", "content": "Document: the red gate is open. " * (3 + 7 * i)}],
                 tasktype="PairWise", subtype="same", chosen=f"It is open {i}.", rejected="It is closed.",
                 ctx_length_for_length="4k") for i in range(3)]
    (tmp_path / "LongQA.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    samples = load_task_file(str(tmp_path / "LongQA.jsonl"))
    tokenizer, _ = load_chat_tokenizers(str(path))
    sequences = [ids for s in samples for ids, _ in disrm_sequences(s, tokenizer)]
    sequences.append(np.random.default_rng(0).integers(3, VOCAB, 300).astype(np.int32))  # a second bucket
    model = load_pretrained(path, dtype="float32")
    ours = DisRMScorer(model, 0, batch_size=4).score(sequences, progress=False)
    with torch.no_grad():
        theirs = np.array([ref(torch.tensor(s[None].astype(np.int64))).logits[0, 0].item() for s in sequences])
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)


def test_shared_prompt_groups_match_transformers(classifier):
    """``--share-prompt`` scoring of several samples at once (prefixes of different lengths, 2-3 answers each,
    answers of different lengths) equals transformers scoring each sequence whole, whether the fitted prefix
    buckets are one per distinct length (free compiles) or one for all (compiles priced out)."""
    from longrm_jax.evaluation import shared_prompt
    from longrm_jax.evaluation.shared_prompt import SharedPromptScorer

    path, ref = classifier
    rng = np.random.default_rng(1)
    groups = []
    for prefix_len, answers in ((20, (3, 9)), (45, (1, 5, 17)), (70, (4, 4)), (33, (6, 2))):
        prefix = rng.integers(3, VOCAB, prefix_len).astype(np.int32)
        groups.append([np.concatenate([prefix, rng.integers(3, VOCAB, n).astype(np.int32)]) for n in answers])
    model = load_pretrained(path, dtype="float32")
    with torch.no_grad():
        theirs = [np.array([ref(torch.tensor(s[None].astype(np.int64))).logits[0, 0].item() for s in g])
                  for g in groups]
    for new_bucket_flops in (0.0, 1e30):
        shared_prompt._COMPILED.clear()
        scorer = SharedPromptScorer(model, 0, chunk=16, new_bucket_flops=new_bucket_flops)
        ours = scorer.score_groups(groups)
        for mine, hf in zip(ours, theirs):
            np.testing.assert_allclose(mine, hf, rtol=1e-4, atol=1e-6)
        buckets = set(shared_prompt._COMPILED[16])
        assert buckets == ({32, 48, 80} if new_bucket_flops == 0 else {80})  # 33 rounds to 48, with 45
        assert scorer.timings["prefill_tokens"] == 20 + 45 + 70 + 33


def _hf_greedy(ref, prompt, stop_id):
    with torch.no_grad():
        out = ref.generate(torch.tensor(prompt[None].astype(np.int64)), max_new_tokens=NEW_TOKENS, do_sample=False,
                           eos_token_id=stop_id, pad_token_id=0)
    return out[0, len(prompt):].numpy()


def test_grm_greedy_matches_generate(causal_lm):
    path, ref = causal_lm
    model = load_pretrained(path, dtype="float32")
    rng = np.random.default_rng(1)
    prompts = [rng.integers(5, VOCAB, n).astype(np.int32) for n in (41, 9, 100)]
    # A stop id no row produces, so all 64 tokens are compared; then the 6th token of row 0 as a stop id.
    generator = GreedyGenerator(model, pad_id=0, stop_ids=[1], max_new_tokens=NEW_TOKENS, letter_ids=[37, 38],
                                batch_size=4)
    outs = generator.generate(prompts, progress=False)
    references = [_hf_greedy(ref, p, 1) for p in prompts]
    for out, theirs in zip(outs, references):
        assert len(out.tokens) == NEW_TOKENS and not out.stopped
        np.testing.assert_array_equal(out.tokens, theirs)
        assert out.letter_logprobs.shape == (NEW_TOKENS, 2) and np.all(out.letter_logprobs <= 0)

    # Greedy decoding is deterministic, so stopping at a token only cuts HF's continuation there.
    stop = int(references[0][5])
    generator = GreedyGenerator(model, pad_id=0, stop_ids=[stop], max_new_tokens=NEW_TOKENS, letter_ids=[37, 38],
                                batch_size=4)
    outs = generator.generate(prompts, progress=False)  # same shapes: no recompile
    for out, theirs in zip(outs, references):
        cut = [i for i, t in enumerate(theirs.tolist()) if t == stop]
        assert out.stopped == bool(cut)
        np.testing.assert_array_equal(out.tokens, theirs[: cut[0]] if cut else theirs)
    assert outs[0].stopped and len(outs[0].tokens) == references[0].tolist().index(stop)


def test_common_prefix_length():
    from longrm_jax.evaluation.shared_prompt import common_prefix_length

    a = np.array([1, 2, 3, 4, 5])
    assert common_prefix_length([a, np.array([1, 2, 3, 9])]) == 3
    assert common_prefix_length([a, a.copy()]) == 4  # identical: keep one token of suffix
    assert common_prefix_length([a, np.array([7, 2, 3])]) == 0
    assert common_prefix_length([a, np.array([1, 2]), np.array([1, 2, 3])]) == 1


def test_grm_decode_cache_donation_is_usable(causal_lm):
    """The decode loop returns its cache so that the donated input cache aliases an output (updated in place);
    without that output XLA copies the whole cache into the loop on entry. Checked on the lowered program:
    every cache leaf carries an input -> output alias."""
    from functools import partial

    import jax

    from longrm_jax.evaluation.batching import Batch, pad_rows
    from longrm_jax.evaluation.grm.generation import _decode

    path, _ = causal_lm
    model = load_pretrained(path, dtype="float32")
    generator = GreedyGenerator(model, pad_id=0, stop_ids=[1], max_new_tokens=4, letter_ids=[37, 38], batch_size=2)
    prompts = [np.arange(5, 17, dtype=np.int32), np.arange(5, 12, dtype=np.int32)]
    ids, lengths = pad_rows(prompts, Batch(12, 2, (0, 1)), 0)
    ids, positions, last = generator._prefill_inputs(ids, lengths)
    cache, first, letters = generator._prefill_fn(12 + 4)(model, ids, positions, last, generator.letter_ids)
    decode = jax.jit(partial(_decode, max_new=4, pad_id=0), donate_argnums=(1,))
    text = decode.lower(model, cache, first, letters, lengths, generator.stop_ids, generator.letter_ids).as_text()
    cache_leaves = len(jax.tree.leaves(cache))
    assert text.count("tf.aliasing_output") == cache_leaves
