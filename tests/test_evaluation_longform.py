"""Long-form RewardBench by its own protocol: per-response GRM judging ending in `**Result:** x.y`, binary
(per-pair) and best-of-N accuracy for both RM kinds, on hand-made records; the benchmark's own protocol (prompts,
parser, unparsed scores) and needle table written here from its public code and compared with ours (issue 32);
the CLI flags of issue 18 (--longform-protocol, --task-types, --chat-template) end to end with tiny checkpoints."""

import csv
import json
import math
import random
import re

import numpy as np
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


# --- upstream's protocol, written here from HuihuiChyan/Long-formRMB (evaluation/infer_bon_vllm.py and
# cal_accuracy_from_file.py, scoring mode) to check ours against -------------------------------------------------
def _upstream_parse(text):
    match = re.search(r"\*\*Result:\*\* ([1-9]\.[0-9]*)", text.strip())  # infer_bon_vllm.parse_score_from_text
    return float(match.group(1)) if match is not None else None


def _upstream_accuracy(entries):
    """cal_accuracy_from_file (scoring): per subset and overall, (traditional %, binary %)."""
    total, right, pairs, right_pairs = {}, {}, {}, {}
    for data in entries:
        subset = data["subset"]
        chosen_scores, rejected_scores = data["chosen_scores"], data["rejected_scores"]
        ok = True
        if not chosen_scores or not rejected_scores:
            ok = False
        else:
            for c in chosen_scores:
                if c is None:
                    ok = False
                    break
                for r in rejected_scores:
                    if r is None:
                        ok = False
                        break
                    if c <= r:
                        ok = False
                        break
                if not ok:
                    break
        n_pairs = n_right = 0
        for c in chosen_scores:
            for r in rejected_scores:
                if c is not None and r is not None:
                    n_pairs += 1
                    n_right += c > r
        for key in (subset, "AVG."):
            total[key] = total.get(key, 0) + 1
            right[key] = right.get(key, 0) + ok
            pairs[key] = pairs.get(key, 0) + n_pairs
            right_pairs[key] = right_pairs.get(key, 0) + n_right
    return {k: (100 * right[k] / total[k], 100 * right_pairs[k] / pairs[k] if pairs[k] else 0.0) for k in total}


# Judge outputs that separate the two parsers: upstream's takes the first strict "**Result:** d.d" only.
_OUTPUTS = ["Fine.\n**Result:** 7.5", "**Result:** 8", "**Result:** 10.0", "**Result:** 0.5", "**Result:**  6.0",
            "**Result:** 3.0 ... on reflection\n**Result:** 8.5", "**Result**: 6.5", "no score at all", "**Result:** 9.",
            "  **Result:** 4.25  ", "Result: 7.0", "**Result:** [5.5]"]


def test_upstream_parser_takes_the_first_strict_result():
    for text in _OUTPUTS:
        assert longform.parse_result(text, "upstream") == _upstream_parse(text), text
    assert longform.parse_result("**Result:** 3.0 then **Result:** 8.5", "upstream") == 3.0
    assert [longform.parse_result(t, "upstream") for t in ("**Result:** 8", "**Result:** 10.0", "**Result:** 0.5",
                                                           "**Result:**  6.0")] == [None] * 4
    assert longform.parse_result("**Result:** 3.0 then **Result:** 8.5") == 8.5  # ours (pointwise): the last


def test_upstream_protocol_scores_equal_upstreams_code_and_differ_from_ours():
    """40 synthetic records, outputs drawn from texts that parse differently: upstream's own accuracy code and
    ours under protocol upstream give the same best-of-N and binary accuracy per subset; ours (pointwise) differ."""
    rng = random.Random(0)
    predictions = {"upstream": [], "pointwise": []}
    entries = []
    for i in range(40):
        subset = ("QA", "Writing", "Reasoning")[i % 3]
        sample = _sample(2 if subset == "Reasoning" else 4, subset)
        outputs = [rng.choice(_OUTPUTS) for _ in sample.answers]
        for protocol in predictions:
            predictions[protocol].append(longform.pointwise_prediction(sample, outputs, [1] * len(outputs),
                                                                       [False] * len(outputs), protocol))
        scores = [_upstream_parse(text) for text in outputs]
        entries.append({"subset": subset, "chosen_scores": scores[:1], "rejected_scores": scores[1:]})
    expected = _upstream_accuracy(entries)
    ours = dict(longform.summary_rows(predictions["upstream"]))
    for key, (accuracy, binary) in expected.items():
        assert ours[key] == round(accuracy / 100, 5) and ours[f"{key} Binary"] == round(binary / 100, 5), key
    lenient = dict(longform.summary_rows(predictions["pointwise"]))
    assert lenient["AVG."] != ours["AVG."] and lenient["AVG. Binary"] != ours["AVG. Binary"]
    assert all(p["protocol"] == "upstream" for p in predictions["upstream"])


def test_upstream_prompt_is_raw_text_chosen_by_model_name():
    """The repository's prompt for the model directory's name (else Default), formatted, no chat template; the
    ids are the tokenizer's own encoding of that string (special tokens as vLLM adds them)."""
    from longrm_jax.data.tokenize import ChatTokenizer
    from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR

    sample = _sample(4)
    text = longform.upstream_prompt("/models/Skywork-Critic-Llama-3.1-8B", sample.prompt, "answer 0")
    assert text.startswith("Please act as an impartial judge") and text.endswith(
        "[User Question]\nWrite an essay.\n\n[The Start of Assistant's Answer]\nanswer 0\n"
        "[The End of Assistant's Answer]")
    default = longform.upstream_prompt("runs/my_judge", sample.prompt, "answer 0")
    assert default.startswith("### Task Description") and default.endswith(
        "[Query]\nWrite an essay.\n\n[Response]\nanswer 0\n\n[Your judgement]")
    assert longform.upstream_prompt("a/Selene-1-Mini-Llama-3.1-8B", "p", "r").endswith(
        "Instruction:\np\n\nResponse:\nr\n\nPlease provide your evaluation:")
    tok = ChatTokenizer.from_dir(TINY_TOKENIZER_DIR)
    ids, cut = longform.pointwise_prompt_ids(sample, tok, 0, None, "upstream", "runs/my_judge")
    assert not cut and ids.tolist() == tok.hf(default)["input_ids"]
    assert "<|im_start|>" not in tok.hf.decode(ids.tolist())  # no chat template


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
    from helpers.tiny_checkpoint import make_tiny_model_dir

    make_tiny_model_dir(path, "qwen3" if head == "causal_lm" else "llama", head, layers=1)
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
        assert p["protocol"] == "upstream" and len(p["outputs"]) == 4 and len(p["scores"]) == 4
    with open(save / "results.csv") as handle:
        labels = [r[1] for r in list(csv.reader(handle))[1:]]
    assert labels == ["Writing", "Writing Binary", "AVG.", "AVG. Binary"]
    results = json.loads((save / "results.json").read_text())
    assert results["long_form_protocol"] == "upstream" and results["settings"]["longform_protocol"] == "upstream"


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


# --- the needle test: upstream's fields and its accuracy table (divide_result_bon2pair.py) ------------------------
def _upstream_length_position(results, lengths, positions, num_intervals=5):
    """calculate_accuracy_by_length_and_position of divide_result_bon2pair.py, written here from the public code,
    on in-memory lists instead of files (results: 0/1 per record; lengths: word_count; positions: tagged_position)."""
    combined = [{"result": r, "length": n, "position": p} for r, n, p in zip(results, lengths, positions)]
    out, bucket = [], []
    for i, item in enumerate(combined):
        bucket.append(item)
        if (i != 0 and combined[i]["length"] != combined[i - 1]["length"]) or i == len(combined) - 1:
            bucket.sort(key=lambda x: x["position"])
            per = math.ceil(len(bucket) / num_intervals)
            cells = []
            for j in range(num_intervals):
                start, end = j * per, min((j + 1) * per, len(bucket))
                if start >= len(bucket):
                    break
                part = bucket[start:end]
                cells.append({"position_start": part[0]["position"], "position_end": part[-1]["position"],
                              "total_items": len(part), "accuracy": sum(d["result"] == 1 for d in part) / len(part)})
            out.append({"length": combined[i - 1]["length"], "position_results": cells})
            bucket = []
    return out


@pytest.mark.parametrize("count", [40, 23, 6])
def test_needle_table_equals_upstreams_per_length_bucket(count):
    """Ours and upstream's code on the same records of one length bucket: the same intervals, counts and
    accuracies. (Upstream closes a bucket only after appending the first record of the next length, so over
    several lengths in one file it moves that record into the previous bucket; we group by the value.)"""
    from longrm_jax.evaluation import plots

    rng = random.Random(count)
    positions = [round(rng.random(), 2) for _ in range(count)]  # rounded: ties exercise the stable order
    results = [rng.random() < 0.6 for _ in range(count)]
    (expected,) = _upstream_length_position([int(r) for r in results], [2000] * count, positions)
    records = [dict(needle_position=p, length="2000", correct=r) for p, r in zip(positions, results)]
    rows, _, accuracy, counts, ranges = plots.needle_heatmap_table(records)
    assert rows == ["2000"]
    cells = expected["position_results"]
    assert counts[0, :len(cells)].tolist() == [c["total_items"] for c in cells] and counts[0, len(cells):].sum() == 0
    np.testing.assert_allclose(accuracy[0, :len(cells)], [c["accuracy"] for c in cells], rtol=0, atol=1e-12)
    assert ranges[0][:len(cells)] == [[c["position_start"], c["position_end"]] for c in cells]


def test_upstream_needle_fields_are_read_and_a_missing_heatmap_is_explained(tmp_path):
    """`tagged_position` and `word_count` (the benchmark's names) give the needle position and length bucket;
    records without them leave the heatmap undrawn, and the summary says why."""
    from longrm_jax.evaluation.judging import disrm_prediction
    from longrm_jax.evaluation.outputs import summarize
    from longrm_jax.evaluation.samples import load_task_file

    rows = [dict(id=f"n{i}", prompt="Write.", chosen=["good"], rejected=["bad"] * 3, subset="Writing",
                 tagged_position=i / 10, word_count=(1000, 4000)[i % 2]) for i in range(10)]
    path = tmp_path / "needle.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = load_task_file(str(path))
    assert sorted((s.needle_position, s.length) for s in samples) == sorted(
        (r["tagged_position"], str(r["word_count"])) for r in rows)
    predictions = [disrm_prediction(s, [1.0, 0.0, 0.5, 0.2], [s.shown_order], [1] * 4, [False] * 4) for s in samples]
    assert "needle_heatmap_note" not in summarize(predictions, [])
    plain = [{k: v for k, v in p.items() if k != "needle_position"} for p in predictions]
    note = summarize(plain, [])["needle_heatmap_note"]
    assert note.startswith("not drawn: no Long-form record carries a needle position") and "tagged_position" in note
    assert "2 of 10 Long-form records carry no needle position" in summarize(predictions[:8] + plain[8:], [])[
        "needle_heatmap_note"]
