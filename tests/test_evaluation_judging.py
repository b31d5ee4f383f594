"""From model outputs to predictions: orders judged, GRM verdict-letter scores (AUC input), long-form rules."""

import numpy as np
import pytest
from transformers import AutoTokenizer

from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
from longrm_jax.evaluation import judging
from longrm_jax.evaluation.grm.generation import Generation
from longrm_jax.evaluation.samples import LONG_FORM, EvalSample


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)


def _sample(n=2, shown=None, benchmark="long-rewardbench", num_chosen=1):
    return EvalSample(id="x", task="LongQA", tasktype="PairWise" if n == 2 else "BestOfN", subtype="same",
                      length="4k", answers=[f"a{i}" for i in range(n)], shown_order=shown or list(range(n)),
                      file="f.jsonl", row=1, benchmark=benchmark,
                      prompt_template=[{"role": "user", "content": "q"}], num_chosen=num_chosen)


def test_judged_orders():
    assert judging.judged_orders(_sample(2, [1, 0]), False) == [[1, 0]]
    assert judging.judged_orders(_sample(2, [1, 0]), True) == [[1, 0], [0, 1]]
    assert judging.judged_orders(_sample(3, [2, 0, 1]), True) == [[2, 0, 1], [0, 1, 2], [1, 2, 0]]


def _generation(tokenizer, text, letter_logprobs_at=None, num_letters=2):
    tokens = np.asarray(tokenizer.encode(text, add_special_tokens=False), np.int32)
    letters = np.full((len(tokens), num_letters), -50.0, np.float32)
    if letter_logprobs_at is not None:
        index, values = letter_logprobs_at
        letters[index] = values
    return Generation(tokens, letters, True)


def test_grm_verdict_scores_read_the_letter_position(tokenizer):
    letter_ids = [tokenizer.encode("[[A", add_special_tokens=False)[-1],
                  tokenizer.encode("[[B", add_special_tokens=False)[-1]]
    text = "The second is better. [[B]]"
    tokens = tokenizer.encode(text, add_special_tokens=False)
    b_index = len(tokens) - 1 - tokens[::-1].index(letter_ids[1])
    generation = _generation(tokenizer, text, (b_index, [np.log(0.2), np.log(0.8)]))
    sample = _sample(2, [1, 0])  # A shows the rejected answer, B the chosen one
    record = judging.grm_prediction(sample, [[1, 0]], [generation], tokenizer, letter_ids, [10], [False])
    assert record["verdict"] == "B>A" and record["predicted_ranks"] == [1, 0]
    assert record["correct"] is True and record["score"] == 1.0
    # answer_scores are in gold order: chosen (shown as B) gets log 0.8.
    np.testing.assert_allclose(record["answer_scores"], [np.log(0.8), np.log(0.2)], rtol=1e-6)
    assert record["output"] == tokenizer.decode(generation.tokens, skip_special_tokens=True)


def test_grm_without_verdict_is_wrong_and_tied(tokenizer):
    generation = _generation(tokenizer, "I cannot decide.")
    record = judging.grm_prediction(_sample(2), [[0, 1]], [generation], tokenizer, [37, 38], [5], [False])
    assert record["verdict"] is None and record["correct"] is False and record["score"] == 0.0
    assert record["answer_scores"] == [0.0, 0.0]


def test_token_index_at_char(tokenizer):
    text = "abc [[A]] done"
    tokens = tokenizer.encode(text, add_special_tokens=False)
    index = judging.token_index_at_char(tokenizer, tokens, text.index("A"))
    assert tokenizer.decode(tokens[index:index + 1]) == "A"
    assert judging.token_index_at_char(tokenizer, tokens, len(text) + 5) is None


def test_disrm_prediction_ties_and_long_form():
    sample = _sample(2, [1, 0])
    record = judging.disrm_prediction(sample, [0.5, 0.5], [[1, 0]], [3, 3], [False, False])
    # Tie: the earlier shown position (the rejected answer) wins, as upstream's stable sort.
    assert record["predicted_ranks"] == [0, 1] and record["correct"] is False
    long_form = _sample(4, [2, 0, 3, 1], benchmark=LONG_FORM)
    assert judging.disrm_prediction(long_form, [1.0, 0.2, 0.3, 1.0], [[2, 0, 3, 1]], [1] * 4, [False] * 4
                                    )["correct"] is False  # tie with a rejected answer is wrong
    record = judging.disrm_prediction(long_form, [1.1, 0.2, 0.3, 1.0], [[2, 0, 3, 1]], [1] * 4, [False] * 4)
    assert record["correct"] is True and record["score"] == 1.0
    # Long-form GRM rule: the chosen answer must be ranked first; the rejected ones' order does not matter.
    assert judging.is_correct(long_form, [2, 0, 3, 1], [3, 0, 1, 2])
    assert not judging.is_correct(long_form, [2, 0, 3, 1], [0, 1, 2, 3])
