"""The evaluator's paths on the issue-43 families (fp32, tiny random checkpoints): GRM greedy decoding (static
batches; for Gemma 3 continuous batching and the evaluator's fused, unrolled decode layout) equals transformers'
``generate`` for Qwen2, Mistral with a sliding window and Gemma 3 (local and global layers), each generating past
the window; DisRM scores of a Gemma 3 score head equal transformers'."""

import numpy as np
import pytest

import torch
import transformers

from longrm_jax import load_pretrained
from longrm_jax.evaluation.grm.generation import GreedyGenerator, prepare_for_decoding
from longrm_jax.evaluation.scoring import DisRMScorer
from helpers.family_parity import make_model

VOCAB = 256
NEW_TOKENS = 20
WINDOW = 8
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _config(family):
    if family == "qwen2":
        return "Qwen2ForCausalLM", transformers.Qwen2Config(num_hidden_layers=2, tie_word_embeddings=True, **COMMON)
    if family == "mistral":
        return "MistralForCausalLM", transformers.MistralConfig(num_hidden_layers=2, head_dim=16,
                                                                sliding_window=WINDOW, **COMMON)
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    return "Gemma3ForCausalLM", transformers.Gemma3TextConfig(
        num_hidden_layers=7, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW, rope_parameters=rope,
        **COMMON)


@pytest.mark.parametrize("family", ["qwen2", "mistral", pytest.param("gemma3", marks=pytest.mark.slow)])
def test_greedy_decoding_matches_generate(tmp_path, family):
    cls, config = _config(family)
    ref = make_model(cls, config, tmp_path)
    model = load_pretrained(tmp_path, dtype="float32")
    rng = np.random.default_rng(4)
    prompts = [rng.integers(5, VOCAB, n).astype(np.int32) for n in (13, 5, 30)]
    theirs = []
    for prompt in prompts:
        with torch.no_grad():
            out = ref.generate(torch.tensor(prompt[None].astype(np.int64)), max_new_tokens=NEW_TOKENS,
                               do_sample=False, eos_token_id=3, pad_token_id=0)
        hf = out[0, len(prompt):].numpy().tolist()
        theirs.append(hf[:hf.index(3)] if 3 in hf else hf)  # we stop before the stop token, HF emits it
    assert sum(len(hf) > WINDOW for hf in theirs) >= 2  # rows that decode past the window
    # Static batches for Qwen2 and Mistral, continuous batching (rows as rings of cache slots) for Gemma 3.
    generator = GreedyGenerator(model, pad_id=0, stop_ids=[3], max_new_tokens=NEW_TOKENS, batch_size=2,
                                continuous=family == "gemma3", decode_chunk=4)
    for mine, hf in zip(generator.generate(prompts, progress=False), theirs):
        np.testing.assert_array_equal(mine.tokens, hf)
    if family == "gemma3":
        # The evaluator's layout: fused q/k/v (Gemma's (1 + weight) q/k norms per slice), and decode steps over
        # unrolled layers (each layer's kind known statically: no lax.cond, masks picked in Python).
        prepare_for_decoding(model, decode_attention="xla")
        model.use_decode_attention("xla", unroll_layers=True)
        generator = GreedyGenerator(model, pad_id=0, stop_ids=[3], max_new_tokens=NEW_TOKENS, batch_size=2,
                                    decode_chunk=4)
        for mine, hf in zip(generator.generate(prompts, progress=False), theirs):
            np.testing.assert_array_equal(mine.tokens, hf)


def test_gemma3_disrm_scores_match_transformers(tmp_path):
    _, config = _config("gemma3")
    config.num_labels = 1
    ref = make_model("Gemma3TextForSequenceClassification", config, tmp_path)
    model = load_pretrained(tmp_path, dtype="float32")
    rng = np.random.default_rng(5)
    sequences = [rng.integers(3, VOCAB, n).astype(np.int32) for n in (6, 23, 40)]
    ours = DisRMScorer(model, 0, batch_size=2).score(sequences, progress=False)
    with torch.no_grad():
        theirs = np.array([ref(torch.tensor(s[None].astype(np.int64))).logits[0, 0].item() for s in sequences])
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
