"""`data.response_end` (issue 32 item 7, the DisRM score position): under "template" a training sequence is,
token for token, the sequence `evaluate --is-disrm` scores for the same prompt and answer, so BT trains the
score where the evaluator reads it; under "upstream" (the default, upstream's rule) the training sequence stops
at the end-of-turn token and the evaluator reads one token later, after the template's newline. The evaluator's
side is its own function (`evaluation.encoding.disrm_sequences`) on a synthetic Long-RewardBench file, with the
tiny tokenizer (Qwen3's turn ending `<|im_end|>\n`). The tiny *judge* tokenizer's template ends a conversation at
`<|im_end|>`, so there upstream's rule already trains the sequence the evaluator scores (the tiny DisRM recipe)."""

import numpy as np
import pytest

from longrm_jax.data.records import PreferenceRecord, Provenance
from longrm_jax.data.synthetic import write_long_rewardbench
from longrm_jax.data.tiny_tokenizer import TINY_JUDGE_TOKENIZER_DIR, TINY_TOKENIZER_DIR
from longrm_jax.data.tokenize import ChatTokenizer
from longrm_jax.evaluation.encoding import disrm_sequences
from longrm_jax.evaluation.samples import load_task_file
from longrm_jax.training.config import ConfigError, load_config


@pytest.fixture(scope="module")
def bench_samples(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    files = write_long_rewardbench(str(out), per_task=3, seed=0, lengths=[64], tasks=["LongQA"], bon_fraction=0)
    return load_task_file(next(iter(files.values())), "LongQA")


def _training_sequences(sample, response_end, tokenizer_dir=TINY_TOKENIZER_DIR):
    tok = ChatTokenizer.from_dir(tokenizer_dir, enable_thinking=None, response_end=response_end)
    record = PreferenceRecord(tuple(sample.prompt_messages()), sample.answers[0], tuple(sample.answers[1:]),
                              Provenance("bench", sample.row))
    return tok, tok.tokenize(record, num_rejects=len(sample.answers) - 1).samples


def test_template_end_trains_the_sequence_the_evaluator_scores(bench_samples):
    for sample in bench_samples:
        tok, trained = _training_sequences(sample, "template")
        scored = disrm_sequences(sample, tok)
        assert len(trained) == len(scored) == len(sample.answers)
        for train, (ids, truncated) in zip(trained, scored):
            assert not truncated
            np.testing.assert_array_equal(train.input_ids, ids)
            assert train.loss_mask[-1] == 1 and train.loss_mask[:train.prompt_len].sum() == 0
            assert tok.hf.decode(train.input_ids[-2:].tolist()) == "<|im_end|>\n"


def test_upstream_end_stops_one_token_before_the_evaluators_position(bench_samples):
    for sample in bench_samples:
        tok, trained = _training_sequences(sample, "upstream")
        for train, (ids, _) in zip(trained, disrm_sequences(sample, tok)):
            np.testing.assert_array_equal(train.input_ids, ids[:-1])  # the evaluator adds the template's "\n"
            assert train.input_ids[-1] == tok.eos_id and tok.hf.decode(ids[-1:].tolist()) == "\n"


def test_judge_tokenizer_scores_where_upstreams_rule_trains(bench_samples):
    for sample in bench_samples:
        for response_end in ("upstream", "template"):
            tok, trained = _training_sequences(sample, response_end, TINY_JUDGE_TOKENIZER_DIR)
            for train, (ids, _) in zip(trained, disrm_sequences(sample, tok)):
                np.testing.assert_array_equal(train.input_ids, ids)
                assert train.input_ids[-1] == tok.eos_id


def test_response_end_is_checked(tmp_path):
    with pytest.raises(ValueError, match="response_end must be one of upstream, template"):
        ChatTokenizer.from_dir(TINY_TOKENIZER_DIR, response_end="eos")
    path = tmp_path / "c.yaml"
    path.write_text("stage: bt\ndata: {response_end: newline}\n")
    with pytest.raises(ConfigError, match="data.response_end must be one of upstream, template; got 'newline'"):
        load_config(str(path))
