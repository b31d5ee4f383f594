"""Synthetic judge-training data (GRM SFT / SimPO, DisRM BT): the judge sees exactly the evaluator's judge prompt,
the target judgement parses to the right verdict with the evaluator's parser, and the Long-RewardBench files are
held out from every training file."""

import json
import os
import subprocess
import sys

import pytest

from longrm_jax.data import synthetic
from longrm_jax.data.readers import read_records
from longrm_jax.data.synthetic_judge import judgement_text, misjudgement_text
from longrm_jax.data.tiny_tokenizer import TINY_JUDGE_TOKENIZER_DIR
from longrm_jax.data.tokenize import ChatTokenizer
from longrm_jax.evaluation.encoding import grm_prompt_ids, verdict_letter_token_ids
from longrm_jax.evaluation.prompts import PAIR_SYSTEM_PROMPT, parse_pairwise_verdict
from longrm_jax.evaluation.samples import EvalSample, load_task_file


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("judge")
    synthetic.main(["--out", str(out), "--judge", "--num-train", "24", "--num-eval", "6", "--bench-per-task", "6",
                    "--bench-bon-fraction", "0", "--lengths", "32,64"])
    return out


def _rows(path):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_judgements_parse_to_the_right_verdict(files):
    for sft, pref in zip(_rows(files / "judge_sft_train.jsonl"), _rows(files / "judge_train.jsonl")):
        right = [0, 1] if sft["verdict"] == 0 else [1, 0]
        assert parse_pairwise_verdict(sft["golden"]) == right
        assert pref["chosen"] == sft["golden"] and pref["chat_template"] == sft["chat_template"]
        (wrong,) = pref["rejects"]
        assert parse_pairwise_verdict(wrong) == right[::-1]
        system, user = sft["chat_template"]
        assert system == {"role": "system", "content": PAIR_SYSTEM_PROMPT}
        document = user["content"].split("\n\nQuestion:")[0]
        shown = [part.split("\n")[1] for part in user["content"].split("[The Start of Assistant ")[1:]]
        assert shown[sft["verdict"]] in document and shown[1 - sft["verdict"]] not in document
        assert shown[0].split()[:-1] == shown[1].split()[:-1]  # same key and words: only the password differs
        # the reasoning steps quote what the prompt states: the document's password, each answer's with its letter
        # echoed, then the document's again with the letter of the answer that states it, as the verdict
        values = [answer.rstrip(".").split()[-1] for answer in shown]
        letter, other = "AB"[sft["verdict"]], "AB"[1 - sft["verdict"]]
        right_value = values[sft["verdict"]]
        listed = f"The answers: {values[0]} A [A], {values[1]} B [B]."
        assert sft["golden"] == (f"The document says {right_value}. {listed} The document says {right_value} "
                                 f"{letter} [[{letter}]]")
        # SimPO's rejected judgement quotes the same and decides the other way
        assert wrong == f"The document says {right_value}. {listed} The document says {right_value} {other} [[{other}]]"

        # the "check" style (--judgement check): each answer restated in the needle sentence, then the comparison
        def steps(document_value, turned=False):
            return " ".join(f"Assistant {'AB'[i]}: t{answer[1:-1]}"
                            + (" as the document." if (value == document_value) != turned else ", not the document.")
                            for i, (answer, value) in enumerate(zip(shown, values)))

        assert judgement_text(right_value, shown, "check") == (f"The document says {right_value}. "
                                                               f"{steps(right_value)} [[{letter}]]")
        assert misjudgement_text(right_value, shown, "check") == (f"The document says {right_value}. "
                                                                  f"{steps(right_value, turned=True)} [[{other}]]")
        assert parse_pairwise_verdict(misjudgement_text(right_value, shown, "check")) == right[::-1]
    verdicts = [r["verdict"] for r in _rows(files / "judge_sft_train.jsonl")]
    assert 0 < sum(verdicts) < len(verdicts)  # both positions occur


def test_training_prompt_is_the_evaluators_judge_prompt(files):
    """A judge trained on these rows sees, token for token, the prompt the evaluator gives it."""
    tok = ChatTokenizer.from_dir(TINY_JUDGE_TOKENIZER_DIR, enable_thinking=None)
    eval_tok = ChatTokenizer.from_dir(TINY_JUDGE_TOKENIZER_DIR, enable_thinking=False)
    for record, row in zip(read_records(str(files / "judge_sft_train.jsonl"), "sft"),
                           _rows(files / "judge_sft_train.jsonl")):
        sample = tok.tokenize(record).samples[0]
        user = row["chat_template"][1]["content"]
        question = user.split("[User Question]\n", 1)[1].split("\n\n[The Start of", 1)[0]
        answers = [part.split("\n", 1)[1].split("\n[The End of", 1)[0]
                   for part in user.split("[The Start of Assistant ")[1:]]
        bench = EvalSample(id=0, task="t", tasktype="PairWise", subtype="same", length="32", answers=answers,
                           shown_order=[0, 1], file="f", row=1,
                           prompt_template=[{"role": "user", "content": question}])
        prompt, _ = grm_prompt_ids(bench, eval_tok)
        assert list(sample.input_ids[: len(prompt)]) == list(prompt)
        assert sample.loss_mask[: sample.prompt_len].sum() == 0 and sample.loss_mask[len(prompt):].all()
    assert min(verdict_letter_token_ids(eval_tok, 2)) >= 0  # "A"/"B" are single tokens after "[["


def test_benchmark_is_held_out_and_pairwise(files):
    bench_dir = files / "long_rewardbench"
    contexts = set()
    for name in os.listdir(bench_dir):
        for sample in load_task_file(str(bench_dir / name)):
            assert sample.tasktype == "PairWise"
            contexts.add(sample.prompt_template[0]["content"])
    assert len(contexts) == 7 * 6
    for name in ("judge_sft_train", "judge_sft_eval", "disrm_train", "disrm_eval", "train", "eval"):
        for row in _rows(files / f"{name}.jsonl"):
            text = row["chat_template"][-1]["content"]
            assert not any(context.split("\n\nQuestion:")[0] in text for context in contexts), name


def test_disrm_rows_use_the_benchmarks_prompt(files):
    for row in _rows(files / "disrm_train.jsonl"):
        (user,) = row["chat_template"]
        assert user["role"] == "user" and user["content"].startswith("Document:\n")
        (rejected,) = row["rejects"]
        assert row["chosen"] != rejected and row["chosen"].split()[:-1] == rejected.split()[:-1]
        assert row["chosen"] in user["content"] and rejected not in user["content"]


def test_judge_tokenizer_committed_and_reproducible(tmp_path):
    tok = ChatTokenizer.from_dir(TINY_JUDGE_TOKENIZER_DIR)
    assert len(tok.encode(PAIR_SYSTEM_PROMPT)) < 200  # 540 with the needle-only tiny tokenizer
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "build_tiny_tokenizer.py")
    subprocess.run([sys.executable, script, "--judge", "--out", str(tmp_path)], check=True, capture_output=True)
    committed = os.path.join(TINY_JUDGE_TOKENIZER_DIR, "tokenizer.json")
    assert open(tmp_path / "tokenizer.json").read() == open(committed).read()


def test_verification_rows_check_one_answer_against_the_document(files):
    rows = _rows(files / "verify_sft_train.jsonl")
    for row in rows:
        system, user = row["chat_template"]
        task, shown = user["content"].split("\n\n[The Start of Assistant A's Answer]\n")
        answer = shown.removesuffix("\n[The End of Assistant A's Answer]")
        assert answer.startswith("The password of the ") and "[" not in answer
        assert (answer in task) == row["candidate_is_right"]  # the right answer is the document's own fact
        document_value = row["golden"].removeprefix("The document says ").split(".")[0]
        assert f" is {document_value}." in task.split("\n\nQuestion: ")[0]
        restated = "the" + answer.removeprefix("The").removesuffix(".")
        decision = " as the document." if row["candidate_is_right"] else ", not the document."
        assert row["golden"] == f"The document says {document_value}. Assistant A: {restated}{decision}"
    assert 0 < sum(r["candidate_is_right"] for r in rows) < len(rows)


def test_lookup_rows_ask_the_letter_that_follows_a_password(files):
    rows = _rows(files / "lookup_sft_train.jsonl")
    for row in rows:
        (user,) = row["chat_template"]
        listed, question = user["content"].removeprefix("Pairs: ").split(".\n\nQuestion: Which letter follows ")
        pairs = [pair.split(" ") for pair in listed.split(", ")]
        asked = question.removesuffix("?")
        assert 2 <= len(pairs) == row["pairs"] <= 4 and len({p for p, _ in pairs}) == len(pairs)
        assert all(letter in ("A", "B") for _, letter in pairs)
        assert row["golden"] == f"{asked} {dict(pairs)[asked]}"
    letters = [row["golden"][-1] for row in rows]
    assert 0.3 < letters.count("A") / len(letters) < 0.7
    assert _rows(files / "lookup_sft_eval.jsonl") != rows[:len(_rows(files / "lookup_sft_eval.jsonl"))]
