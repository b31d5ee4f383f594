"""The public Python API (longrm_jax.api) and `python -m longrm_jax.score` reproduce `evaluate`'s numbers.

Tiny random checkpoints with the committed tiny tokenizer (helpers.tiny_checkpoint), one Long-RewardBench task file
of pairwise and Best-of-N samples; the evaluator runs in process, so the API's programs reuse its compiles.
"""

import json

import numpy as np
import pytest

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips

from longrm_jax import Judge, RewardModel, evaluate, score
from longrm_jax.data.synthetic import write_long_rewardbench
from longrm_jax.evaluation.samples import load_task_file
from helpers.tiny_checkpoint import make_tiny_model_dir


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    write_long_rewardbench(str(out), per_task=4, seed=0, lengths=(48, 96), tasks=("Code",), bon_fraction=0.5)
    return out / "Code.jsonl"


@pytest.fixture(scope="module")
def disrm(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm")
    make_tiny_model_dir(path, "llama", "classifier", layers=1)
    return str(path)


def _predictions(save):
    return [json.loads(line) for line in (save / "predictions.jsonl").read_text().splitlines()]


def test_reward_model_scores_equal_evaluate(tmp_path, bench, disrm):
    save = tmp_path / "out"
    assert evaluate.main(["--model-path", disrm, "--data-path", str(bench), "--is-disrm", "--save-path", str(save),
                          "--no-progress", "--dtype", "float32"]) == 0
    predictions = _predictions(save)
    samples = load_task_file(str(bench))
    assert [s.id for s in samples] == [p["id"] for p in predictions] and len(samples) == 4
    rm = RewardModel.from_pretrained(disrm)  # dtype None: the checkpoint's, float32, as --dtype auto
    prompts = [s.prompt_template for s in samples for _ in s.answers]
    responses = [a for s in samples for a in s.answers]
    scores = rm.score(prompts, responses)
    assert scores.dtype == np.float32 and scores.shape == (len(responses),)
    expected = [score for p in predictions for score in p["scores"]]  # gold order, as the API was given
    assert scores.tolist() == expected  # the same sequences in the same batches: bit for bit
    first = samples[0]
    one = rm.score(first.prompt_template, first.answers[0])
    assert isinstance(one, float) and one == pytest.approx(predictions[0]["scores"][0], rel=1e-5, abs=1e-6)
    best_of_n = rm.score(first.prompt_template, first.answers)  # one prompt, several responses
    np.testing.assert_allclose(best_of_n, predictions[0]["scores"], rtol=1e-5, atol=1e-6)
    pair = rm.compare(first.prompt_template, first.answers[0], first.answers[1])
    r_a, r_b = predictions[0]["scores"][:2]
    assert pair.score_a == pytest.approx(r_a, rel=1e-5, abs=1e-6) and pair.score_b == pytest.approx(r_b, rel=1e-5,
                                                                                                     abs=1e-6)
    assert pair.probability == pytest.approx(1 / (1 + np.exp(r_b - r_a)), rel=1e-5)
    batch = rm.compare([s.prompt_template for s in samples], [s.answers[0] for s in samples],
                       [s.answers[1] for s in samples])
    assert batch.probability.shape == (4,) and ((batch.probability > 0.5) == (batch.score_a > batch.score_b)).all()
    with pytest.raises(ValueError, match="2 prompts for 3 responses"):
        rm.score(["p", "q"], ["a", "b", "c"])


def test_judge_equals_evaluate(tmp_path, bench):
    """Texts, verdicts and verdict-letter log-probabilities of the evaluator's judgements (random weights: the
    texts hold no verdict, so the parse of a verdict is checked on a written one below)."""
    model = tmp_path / "grm"
    make_tiny_model_dir(model, "qwen3", "causal_lm", layers=1, stop_every=3)  # rows stop at different steps
    save = tmp_path / "out"
    assert evaluate.main(["--model-path", str(model), "--data-path", str(bench), "--save-path", str(save),
                          "--no-progress", "--dtype", "float32", "--max-new-tokens", "8", "--batch-size", "2",
                          "--allow-no-verdicts"]) == 0
    predictions = _predictions(save)
    samples = load_task_file(str(bench))
    judge = Judge.from_pretrained(str(model), dtype="float32", batch_size=2)
    assert {s.judge_kind for s in samples} == {"pair", "rank"} and min(len(s.answers) for s in samples) == 2
    judged = judge.judge_prompts([(s.prompt_template, s.shown_answers(), s.judge_kind) for s in samples],
                                 max_new_tokens=8)
    assert [j.text for j in judged] == [p["output"] for p in predictions]
    assert [j.verdict for j in judged] == [p["verdict"] for p in predictions]
    assert [j.generated_tokens for j in judged] == [p["generated_tokens"] for p in predictions]
    assert len({j.generated_tokens for j in judged}) > 1
    for j, p, s in zip(judged, predictions, samples):  # the evaluator's letter scores are in gold order
        np.testing.assert_allclose([p["answer_scores"][a] for a in s.shown_order], j.letter_logprobs, atol=1e-5)
        assert j.parsed == (p["verdict"] is not None)
    first = samples[0]  # (context, question) as one user turn: the same judge prompt as the record's
    single = judge.judge("", first.prompt_template[0]["content"], first.shown_answers(), max_new_tokens=8,
                         kind=first.judge_kind)
    assert single.text == predictions[0]["output"]


def test_judgement_reads_the_verdict_as_the_evaluator(monkeypatch):
    """A written verdict: pairwise [[B]] -> answer 1 best; a ranking [[C>A>B]] -> answers 2, 0, 1."""
    from longrm_jax.api import Judge as JudgeClass
    from longrm_jax.api import _sample
    from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
    from longrm_jax.evaluation.grm.decoding import Generation
    from longrm_jax.evaluation.encoding import load_chat_tokenizers

    _, tokenizer = load_chat_tokenizers(TINY_TOKENIZER_DIR)
    judge = JudgeClass(None, tokenizer, None)
    for answers, text, verdict, ranking in ((["x", "y"], "B wins. [[B]]", "B>A", [1, 0]),
                                            (["x", "y", "z"], "[Ranking] [[C>A>B]]", "C>A>B", [2, 0, 1]),
                                            (["x", "y"], "no idea", None, [])):
        ids = np.asarray(tokenizer.encode(text), np.int32)
        generation = Generation(ids, np.zeros((len(ids), 3), np.float32), True)
        out = judge.judgement(_sample("q", answers, kind="auto"), generation, ids, False)
        assert (out.verdict, out.ranking, out.best, out.parsed) == (verdict, ranking, ranking[0] if ranking else None,
                                                                    verdict is not None)
        assert out.text == tokenizer.hf.decode(ids.tolist(), skip_special_tokens=True)


def test_score_cli_round_trip_and_bad_rows(tmp_path, bench, disrm, capsys):
    samples = load_task_file(str(bench))[:2]
    rows = [{"prompt": samples[0].prompt_template, "responses": samples[0].answers, "id": "a"},
            {"prompt": "What is 2 + 2?", "response": "4"}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    out = tmp_path / "sub" / "out.jsonl"
    assert score.main(["--model-path", disrm, "--input", str(source), "--output", str(out), "--batch-size", "2",
                       "--chunk", "1"]) == 0
    assert "scored 3 responses of 2 lines" in capsys.readouterr().err
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k not in ("score", "scores")} for r in scored] == rows
    rm = RewardModel.from_pretrained(disrm)
    np.testing.assert_allclose(scored[0]["scores"], rm.score(samples[0].prompt_template, samples[0].answers),
                               rtol=1e-5, atol=1e-6)
    assert scored[1]["score"] == pytest.approx(rm.score("What is 2 + 2?", "4"), rel=1e-5, abs=1e-6)
    bad = tmp_path / "bad.jsonl"
    for text, message in (
            ('{"prompt": "p", "response": "r"}\n{"prompt": "p", "responses": ["a", 3]}\n',
             f"error: {bad}: line 2, field 'responses[1]': must be a string, got int\n"),
            ('{"prompt": "p"}\n', f"error: {bad}: line 1, field 'response': give exactly one of 'response' (a string) "
                                  "and 'responses' (a list of strings)\n"),
            ('{"prompt": 5, "response": "r"}\n', f"error: {bad}: line 1, field 'prompt': must be a string or a "
                                                 "non-empty list of chat messages ({\"role\": ..., \"content\": ...})\n"),
            ('\n{"prompt": "p", "response": "r"\n', f"error: {bad}: line 2: not valid JSON (Expecting ',' delimiter "
                                                    "at column 32)\n")):
        bad.write_text(text)
        assert score.main(["--model-path", disrm, "--input", str(bad), "--output", str(tmp_path / "o.jsonl")]) == 2
        assert capsys.readouterr().err == message
    assert not (tmp_path / "o.jsonl").exists()
    assert score.main(["--model-path", disrm, "--input", str(source), "--output", str(source)]) == 2
    assert "is the input file" in capsys.readouterr().err


def test_score_cli_help_and_a_judge_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        score.main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--model-path", "--input", "--output", "--batch-size", "--dtype", "--no-progress", "--mesh"):
        assert flag in text
    lm = tmp_path / "lm"
    make_tiny_model_dir(lm, "qwen3", "causal_lm", layers=1)
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "p", "response": "r"}\n')
    assert score.main(["--model-path", str(lm), "--input", str(source)]) == 2
    assert "has no trained score head to score with; load it with longrm_jax.Judge" in capsys.readouterr().err


# What the API refuses, with the rule evaluate's flags apply (evaluation.config.setting_problem), before a model
# loads or a batch runs; each was accepted and misread before (a string of answers judged as 18 one-letter answers,
# max_length 0 changing the scores, ...).
LOAD_REFUSALS = [
    (dict(max_length=0), ValueError, "max_length must be >= 16; got 0"),
    (dict(max_length=-10), ValueError, "max_length must be >= 16; got -10"),
    (dict(max_length=5), ValueError, "max_length must be >= 16; got 5"),
    (dict(batch_size=0), ValueError, "batch_size must be >= 1; got 0"),
    (dict(batch_size=-5), ValueError, "batch_size must be >= 1; got -5"),
    (dict(dtype="float64"), ValueError, "dtype must be one of auto, bfloat16, float32, float16; got 'float64'"),
]


@pytest.mark.parametrize("kwargs, error, message", LOAD_REFUSALS, ids=[m for _, _, m in LOAD_REFUSALS])
def test_from_pretrained_refuses_what_evaluate_refuses(disrm, kwargs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        RewardModel.from_pretrained(disrm, **kwargs)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        Judge.from_pretrained(disrm, **kwargs)  # checked before the model kind


def test_calls_refuse_what_they_would_misread(disrm, tmp_path):
    rm = RewardModel.from_pretrained(disrm)
    assert repr(rm) == f"RewardModel({disrm!r}, family=llama, layers=1, dtype=float32, max_length=131072)"
    with pytest.raises(TypeError, match="response must be a list of strings, got int"):
        rm.score("q", 5)
    with pytest.raises(TypeError, match=r"response\[1\] must be a string, got int"):
        rm.score("q", ["a", 3])
    with pytest.raises(TypeError, match="prompt message 0: 'role' must be a string, got nothing"):
        rm.score([{"content": "x"}], "a")
    judge_dir = tmp_path / "judge"
    make_tiny_model_dir(judge_dir, "llama", "causal_lm", layers=1)
    judge = Judge.from_pretrained(str(judge_dir), dtype="float32")
    with pytest.raises(TypeError, match="answers must be a list of strings, got str"):
        judge.judge("ctx", "q", "The password is x.")
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1; got 0"):
        judge.judge("ctx", "q", ["a", "b"], max_new_tokens=0)


def test_a_sequence_past_the_models_positions_is_warned_of(disrm, caplog):
    """The tiny model has 256 positions: a longer scored sequence is named in a warning (it was scored silently)."""
    import logging

    rm = RewardModel.from_pretrained(disrm)
    with caplog.at_level(logging.WARNING, logger="longrm_jax"):
        rm.score("word " * 20, "short")
    assert not [r for r in caplog.records if "max_position_embeddings" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="longrm_jax"):
        rm.score("word " * 400, "short")
    warned = [r.getMessage() for r in caplog.records if "max_position_embeddings" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("1 sequences scored are longer than the model's 256 positions")


def test_score_reads_its_flags_from_a_config_file(tmp_path, disrm):
    """`score --config FILE` (its schema's keys, the training config's format); the command line wins."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "q", "response": "a"}) + "\n")
    config = tmp_path / "score.yaml"
    config.write_text(f"model_path: {disrm}\ninput: {rows}\noutput: {tmp_path / 'ignored.jsonl'}\nprogress: false\n")
    assert score.main(["--config", str(config), "--output", str(tmp_path / "scored.jsonl")]) == 0
    assert not (tmp_path / "ignored.jsonl").exists()
    scored = json.loads((tmp_path / "scored.jsonl").read_text())
    assert scored["score"] == pytest.approx(RewardModel.from_pretrained(disrm).score("q", "a"), rel=1e-5)
