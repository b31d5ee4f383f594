"""Training files for the tiny generative judge and its DisRM (``python -m longrm_jax.data.synthetic --judge``):
pairwise needle rows shown in the evaluator's exact judge prompt (``data.judge_prompts``), with a short reasoning
judgement that ends in the verdict the evaluator parses; SimPO's rejected judgement names the other answer."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence

from longrm_jax.data.judge_prompts import (judge_messages, judge_system_prompt, judge_user_prompt, position_letter,
                                           task_prompt_text)
from longrm_jax.data.needles import (DEFAULT_LENGTHS, answer_text, approx_token_count, bench_row,
                                     corpus_for_tokenizer, default_token_counter, length_label, make_needle_sample,
                                     wrong_values, write_jsonl)

CHECK_SYSTEM_PROMPT = "Check the answer against the document."
# How a judgement reaches its verdict (`judgement_text`): "check" compares each answer with the document in turn;
# "match" lists each answer's password followed by its letter, then the document's password followed by the letter
# that came after it in the list (a copy, as the needle LM's look-up is).
JUDGEMENT_STYLES = ("check", "match", "list", "bracket", "key", "adjacent", "echo")

def judgement_text(document_value: str, shown_answers: Sequence[str], style: str = "check") -> str:
    """A pairwise judgement that reasons in short steps before the verdict `[[A]]`/`[[B]]` (upstream's format,
    parsed by `evaluation.prompts`): the document's password first, then each answer restated in the needle
    sentence with whether its password is the document's, then the verdict:
    `The document says quartz. Assistant A: the password of the blue door is quartz as the document. Assistant B:
    the password of the blue door is orchid, not the document. [[A]]`.

    `shown_answers` are the one-key answers in the order shown (`The password of the blue door is quartz.`). Each
    step is one a small model learns fast: the document's password is the needle look-up of a needle-QA
    pretrained model; the restated answer is a copy from its fixed place in the prompt; the token right after
    its password (` as` or `,`) compares that password with the document's at the place where the needle LM
    predicts the document's password (after `... is`), which is where a DisRM compares them too; the verdict is
    the letter of the clause that says ` as`. (Without the restatement, `Assistant A says quartz as the
    document.`, the comparison stayed at chance: docs/benchmarks.md, the tiny judge recipe's runs G1-G4.) Given the
    true value it is the right judgement; given the other answer's value (SimPO's rejected), a wrong one
    consistent with itself.

    `style="match"` decides by a copy instead of a comparison: `The document says quartz. The answers: orchid A,
    quartz B. The document says quartz B. [[B]]`. The letter after the document's password is the one that followed
    the same password in the list: an induction copy, the circuit a needle-QA model already runs for its look-up.
    """
    values = [_answer_value(answer) for answer in shown_answers]
    verdicts = [position_letter(i) for i, value in enumerate(values) if value == document_value]
    if len(verdicts) != 1:
        raise ValueError(f"judgement_text: exactly one answer must state {document_value!r}, got {values}")
    if style in ("match", "list", "bracket", "key", "adjacent", "echo"):
        return _matched(document_value, values, verdicts[0], style)
    steps = [_checked_answer(i, answer, document_value) for i, answer in enumerate(shown_answers)]
    return f"The document says {document_value}. " + " ".join(steps) + f" [[{verdicts[0]}]]"


def misjudgement_text(document_value: str, shown_answers: Sequence[str], style: str = "check") -> str:
    """The judgement of `judgement_text` with every decision turned: the same quotes (the document's password and
    each answer), each comparison the wrong way and the other verdict:
    `The document says quartz. Assistant A: the password of the blue door is quartz, not the document. Assistant
    B: the password of the blue door is orchid as the document. [[B]]`.

    SimPO's rejected judgement. Against the right one it differs in the decisions alone, so the preference loss
    falls on the comparison, as a DisRM's Bradley-Terry loss does on its pairs (which learn it in a few hundred
    steps), not on quotes that SFT has already taught; and a held-out pair is right only when the comparison is.
    `style="match"`: the same list, the document's password followed by the other letter."""
    if style in ("match", "list", "bracket", "key", "adjacent", "echo"):
        values = [_answer_value(answer) for answer in shown_answers]
        wrong = next(position_letter(i) for i, value in enumerate(values) if value != document_value)
        return _matched(document_value, values, wrong, style)
    steps = [_checked_answer(i, answer, document_value, turned=True) for i, answer in enumerate(shown_answers)]
    verdict = next(position_letter(i) for i, answer in enumerate(shown_answers)
                   if _answer_value(answer) != document_value)
    return f"The document says {document_value}. " + " ".join(steps) + f" [[{verdict}]]"


def _matched(document_value: str, values: Sequence[str], verdict: str, style: str) -> str:
    """A `match` (or `list`: without the first sentence) judgement that gives `verdict` (judgement_text says what
    it is)."""
    if style == "echo":
        listed = ", ".join(f"{value} {position_letter(i)} [{position_letter(i)}]" for i, value in enumerate(values))
        return f"The document says {document_value}. The answers: {listed}. The document says {document_value} {verdict} [[{verdict}]]"
    if style == "adjacent":
        listed = ", ".join(f"{value} {position_letter(i)}" for i, value in enumerate(values))
        return (f"The document says {document_value}. The answers: {listed}. The document says {document_value} "
                f"{verdict} [[{verdict}]]")
    if style == "key":
        listed = ", ".join(f"{value} [[{position_letter(i)}]" for i, value in enumerate(values))
        return f"The answers: {listed}. The document says {document_value} [[{verdict}]]"
    if style == "bracket":
        listed = ", ".join(f"{value} [{position_letter(i)}]" for i, value in enumerate(values))
        return f"The answers: {listed}. The document says {document_value} [[{verdict}]]"
    listed = ", ".join(f"{value} {position_letter(i)}" for i, value in enumerate(values))
    first = f"The document says {document_value}. " if style == "match" else ""
    return f"{first}The answers: {listed}. The document says {document_value} {verdict}. [[{verdict}]]"


def _checked_answer(position: int, answer: str, document_value: str, turned: bool = False) -> str:
    """One step of a judgement: the answer shown at `position` restated, then whether its password is the
    document's (`Assistant B: the password of the blue door is orchid, not the document.`); `turned`: the
    opposite decision."""
    sentence = answer.strip().rstrip(".")
    same = (_answer_value(answer) == document_value) != turned
    return f"Assistant {position_letter(position)}: {sentence[:1].lower()}{sentence[1:]}" + (
        " as the document." if same else ", not the document.")


def _answer_value(answer: str) -> str:
    """The password that a one-key answer (`The password of the blue vault is falcon.`) states."""
    return answer.rstrip(".").split()[-1]


def judge_rows(n: int, seed: str, lengths: Sequence[int], num_distractors: int = 0,
               count_tokens: Callable[[str], int] | None = None, style: str = "check") -> list[dict[str, dict]]:
    """`n` pairwise needle rows, each in three training formats; context lengths cycle through `lengths`.

    `seed` names the random stream (a string, so no stream is another's: the benchmark's are other names).
    Each item: `sft` (the judge prompt + the right judgement), `simpo` (the judge prompt, right and wrong
    judgements) and `disrm` (the row's own prompt, chosen and rejected answers: a DisRM sees what the
    evaluator's DisRM path shows it, `prompt_template` + one answer).
    """
    count_tokens = count_tokens or default_token_counter()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        target = lengths[i % len(lengths)]
        row = bench_row(rng, "judge", i, target, 2, count_tokens, num_distractors, best_of_n=False)
        chosen_at = rng.randrange(2)  # position of the better answer: A or B, half each
        shown = [row["chosen"], row["rejected"]] if chosen_at == 0 else [row["rejected"], row["chosen"]]
        messages = judge_messages(row["prompt_template"], shown, "pair")
        good = judgement_text(_answer_value(row["chosen"]), shown, style)
        bad = misjudgement_text(_answer_value(row["chosen"]), shown, style)
        meta = {"ctx_length": row["ctx_length_for_length"], "depth": row["depth"][0]}
        out.append({
            "sft": {"chat_template": messages, "golden": good, "verdict": chosen_at, **meta},
            "simpo": {"chat_template": messages, "chosen": good, "rejects": [bad], "verdict": chosen_at, **meta},
            "disrm": {"chat_template": row["prompt_template"], "chosen": row["chosen"], "rejects": [row["rejected"]],
                      **meta},
        })
    return out


def verify_rows(n: int, seed: str, lengths: Sequence[int], num_distractors: int = 0,
                count_tokens: Callable[[str], int] | None = None) -> list[dict]:
    """`n` SFT rows that *check one answer* against the document: the judge's reasoning steps without its long
    system prompt and without a verdict. The user turn shows the needle task and one answer between the judge
    prompt's Start/End markers; the answer states the document's password in half of the rows, another one in
    the rest; the target is the judgement's first two steps:
    `The document says quartz. Assistant A: the password of the blue door is orchid, not the document.`

    They teach the comparison that decides every judgement on short sequences, many to a packed row, without the
    evaluator's long system prompt. Not in the shipped recipe: blended 1:1 into the needle LM's rows they delay
    its look-up past 600 steps, and into the judge's SFT rows they did not speed its decisions (docs/benchmarks.md,
    "where the tiny recipe's time goes")."""
    count_tokens = count_tokens or default_token_counter()
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        target = lengths[i % len(lengths)]
        s = make_needle_sample(rng, target, 1, num_distractors, count_tokens)
        value = s.values[0]
        right = rng.randrange(2) == 1
        candidate = answer_text(s.keys, [value if right else wrong_values(rng, value, 1)[0]])
        rows.append({"chat_template": [{"role": "system", "content": CHECK_SYSTEM_PROMPT},
                                       {"role": "user", "content": judge_user_prompt(task_prompt_text(s.messages()),
                                                                                     [candidate])}],
                     "golden": f"The document says {value}. {_checked_answer(0, candidate, value)}",
                     "candidate_is_right": right, "ctx_length": length_label(target),
                     "depth": round(s.depths[0], 4)})
    return rows


def write_judge_files(out_dir: str, num_train: int = 2000, num_eval: int = 200, seed: int = 0,
                      lengths: Sequence[int] = DEFAULT_LENGTHS, num_distractors: int = 0,
                      count_tokens: Callable[[str], int] | None = None, style: str = "check") -> dict[str, str]:
    """Write, per split (`train`, `eval`), the reward-model training files of one stream of pairwise rows:
    `judge_sft_{split}.jsonl` (upstream SFT rows: GRM stage 1), `judge_{split}.jsonl` (upstream preference rows
    of judgements: GRM stage 2 SimPO, and the judge's held-out pairs) and `disrm_{split}.jsonl` (preference
    rows of answers in the benchmark's prompt: DisRM Bradley-Terry). `style`: how judgements decide
    (`JUDGEMENT_STYLES`, `judgement_text`).

    Their random streams differ from every `write_long_rewardbench` stream, so a benchmark written with any seed
    is held out. Returns {name: path}.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, n in (("train", num_train), ("eval", num_eval)):
        rows = judge_rows(n, f"judge-{split}:{seed}", lengths, num_distractors, count_tokens, style)
        for name, column in ((f"judge_sft_{split}", "sft"), (f"judge_{split}", "simpo"),
                             (f"disrm_{split}", "disrm")):
            paths[name] = os.path.join(out_dir, f"{name}.jsonl")
            write_jsonl(paths[name], [item[column] for item in rows])
        paths[f"verify_sft_{split}"] = os.path.join(out_dir, f"verify_sft_{split}.jsonl")
        write_jsonl(paths[f"verify_sft_{split}"], verify_rows(n, f"verify-{split}:{seed}", lengths, num_distractors,
                                                               count_tokens))
    return paths


def judge_corpus_for_tokenizer(num_rows: int = 200, seed: int = 12345) -> list[str]:
    """`corpus_for_tokenizer` plus the judge prompts and judgements (for training the tiny judge tokenizer, whose
    words, the long judge system prompt's included, are then mostly single tokens)."""
    texts = corpus_for_tokenizer()
    texts += [judge_system_prompt(2, "pair")] * 50 + [judge_system_prompt(n, "rank") for n in (3, 4)] * 25
    for item in judge_rows(num_rows, f"tokenizer:{seed}", (64,), count_tokens=approx_token_count):
        answer = item["disrm"]["chosen"]  # "The password of the blue vault is falcon."
        key, value = " ".join(answer.split()[4:6]), answer.rstrip(".").split()[-1]
        texts += [item["sft"]["chat_template"][1]["content"],
                  f"The document says the password of the {key} is {value}. [[{'AB'[item['sft']['verdict']]}]]"]
    return texts
