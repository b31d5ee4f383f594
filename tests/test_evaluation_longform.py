"""Long-form RewardBench by its own protocol: per-response GRM judging ending in `**Result:** x.y`, binary
(per-pair) and best-of-N accuracy for both RM kinds, on hand-made records; the CLI flags of issue 18
(--longform-protocol, --task-types, --chat-template) end to end with tiny checkpoints."""

import csv
import json
import shutil

import pytest

from longrm_jax.evaluation import longform
from longrm_jax.evaluation.samples import LONG_FORM, EvalSample

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips


def _sample(num_answers, subset="Writing"):
    return EvalSample(id="x", task=subset, tasktype="BestOfN", subtype=str(num_answers), length="2K",
                      answers=[f"answer {i}" for i in range(num_answers)], shown_order=list(range(num_answers))[::-1],
                      file="f.jsonl", row=1, benchmark=LONG_FORM, prompt="Write an essay.")


def test_parse_result_takes_the_last_score():
    assert longform.parse_result("Good.\n**Result:** 7.5") == 7.5
    assert longform.parse_result("**Result:** 3.0 at first ... on reflection\n**Result:** 8") == 8.0
    assert longform.parse_result("**Result**: 6.5") == 6.5
    assert longform.parse_result("Result: 7.5") is None and longform.parse_result("") is None


def test_pointwise_messages_show_one_response_and_ask_for_the_result_line():
    system, user = longform.pointwise_messages("Write an essay.", "My essay.")
    assert system["role"] == "system" and system["content"].endswith("**Result:** x.y")
    assert "Write an essay." in user["content"] and "My essay." in user["content"]
    assert user["content"].count("[The Start of the Assistant's Response]") == 1


def test_pointwise_prediction_binary_and_best_of_4():
    """Hand-made: chosen 8.0 vs rejected 7.0, 8.0 (tie: wrong), unparsable (loses)."""
    outputs = ["fine **Result:** 8.0", "**Result:** 7.0", "**Result:** 8.0", "no score"]
    record = longform.pointwise_prediction(_sample(4), outputs, [10] * 4, [False] * 4)
    assert record["scores"] == [8.0, 7.0, 8.0, None] and record["num_unparsable"] == 1
    assert record["correct"] is False and record["score"] == 0.0  # a tie with a rejected fails best-of-4
    assert longform.binary_outcomes(record) == [True, False, True]
    won = longform.pointwise_prediction(_sample(4), ["**Result:** 9.5"] + outputs[1:], [10] * 4, [False] * 4)
    assert won["correct"] is True and longform.binary_outcomes(won) == [True, True, True]
    lost = longform.pointwise_prediction(_sample(2), ["nothing", "**Result:** 1.0"], [1, 1], [False, False])
    assert lost["correct"] is False and longform.binary_outcomes(lost) == [False]


def test_summary_rows_pool_pairs_per_subset():
    a = longform.pointwise_prediction(_sample(4), ["**Result:** 9"] + ["**Result:** 8"] * 2 + ["**Result:** 9.5"],
                                      [1] * 4, [False] * 4)  # 2 of 3 pairs, best-of-4 wrong
    b = longform.pointwise_prediction(_sample(2, "Reasoning"), ["**Result:** 6", "**Result:** 5"], [1, 1],
                                      [False, False])  # 1 of 1
    c = longform.pointwise_prediction(_sample(4), ["**Result:** 9"] + ["**Result:** 1"] * 3, [1] * 4,
                                      [False] * 4)  # 3 of 3
    rows = dict(longform.summary_rows([a, b, c]))
    assert rows == {"Writing": 0.5, "Writing Binary": round(5 / 6, 5), "Reasoning": 1.0, "Reasoning Binary": 1.0,
                    "AVG.": round(2 / 3, 5), "AVG. Binary": round(6 / 7, 5)}


def test_disrm_predictions_get_binary_accuracy():
    from longrm_jax.evaluation.judging import disrm_prediction

    sample = _sample(4)
    record = disrm_prediction(sample, [1.0, 0.5, 1.5, 0.2], [sample.shown_order], [1] * 4, [False] * 4)
    assert record["correct"] is False and longform.binary_outcomes(record) == [True, False, True]
    assert dict(longform.summary_rows([record])) == {"Writing": 0.0, "Writing Binary": round(2 / 3, 5),
                                                      "AVG.": 0.0, "AVG. Binary": round(2 / 3, 5)}


def _tiny_checkpoint(path, head, template=True):
    from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
    from helpers.tiny_checkpoint import make_tiny_checkpoint

    make_tiny_checkpoint(path, "qwen3" if head == "causal_lm" else "llama", head=head, vocab_size=650,
                         pad_token_id=0, kv_heads=2, layers=1)
    for item in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(f"{TINY_TOKENIZER_DIR}/{item}", path / item)
    if not template:  # a base model's tokenizer: no chat template
        config = json.loads((path / "tokenizer_config.json").read_text())
        template_text = config.pop("chat_template")
        (path / "tokenizer_config.json").write_text(json.dumps(config))
        for extra in path.glob("chat_template.*"):
            extra.unlink()
        return str(path), template_text
    return str(path), None


def test_grm_pointwise_end_to_end(tmp_path):
    from longrm_jax import evaluate

    model, _ = _tiny_checkpoint(tmp_path / "grm", "causal_lm")
    data = tmp_path / "lf"
    data.mkdir()
    records = [dict(id=f"r{i}", prompt=f"Write about {i}.", chosen=[f"Good {i}."], rejected=["Bad.", "Worse.", "Meh."],
                    subset="Writing") for i in range(2)]
    (data / "writing.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    save = tmp_path / "out"
    assert evaluate.main(["--model-path", model, "--data-path", str(data), "--save-path", str(save),
                          "--dtype", "float32", "--no-progress", "--max-new-tokens", "4"]) == 0
    predictions = [json.loads(line) for line in (save / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2
    for p in predictions:  # one judgement per response, scored (here unparsable: a random model)
        assert p["protocol"] == "pointwise" and len(p["outputs"]) == 4 and len(p["scores"]) == 4
    with open(save / "results.csv") as handle:
        labels = [r[1] for r in list(csv.reader(handle))[1:]]
    assert labels == ["Writing", "Writing Binary", "AVG.", "AVG. Binary"]


def test_task_types_and_chat_template_override(tmp_path):
    from longrm_jax import evaluate
    from longrm_jax.data.synthetic import write_long_rewardbench

    model, template = _tiny_checkpoint(tmp_path / "rm", "classifier", template=False)
    bench = tmp_path / "bench"
    write_long_rewardbench(str(bench), per_task=4, seed=0, lengths=(48,), tasks=("Math",), bon_fraction=0.5)
    args = ["--model-path", model, "--data-path", str(bench), "--is-disrm", "--dtype", "float32", "--no-progress"]
    assert evaluate.main(args + ["--save-path", str(tmp_path / "a")]) == 2  # no template: a clear refusal
    template_file = tmp_path / "template.jinja"
    template_file.write_text(template)
    save = tmp_path / "b"
    assert evaluate.main(args + ["--save-path", str(save), "--chat-template", str(template_file),
                                 "--task-types", "PairWise"]) == 0
    predictions = [json.loads(line) for line in (save / "predictions.jsonl").read_text().splitlines()]
    assert predictions and all(p["tasktype"] == "PairWise" for p in predictions)
