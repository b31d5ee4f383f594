"""Training files for the tiny generative judge and its DisRM (``python -m longrm_jax.data.synthetic --judge``):
pairwise needle rows shown in the evaluator's exact judge prompt (``data.judge_prompts``), with a short reasoning
judgement that ends in the verdict the evaluator parses; SimPO's rejected judgement names the other answer."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence

from longrm_jax.data.judge_prompts import (judge_messages, judge_system_prompt, judge_user_prompt, position_letter,
                                           task_prompt_text)
from longrm_jax.data.needles import (DEFAULT_LENGTHS, VALUES, answer_text, approx_token_count, bench_row,
                                     corpus_for_tokenizer, default_token_counter, length_label, make_needle_sample,
                                     wrong_values, write_jsonl)

CHECK_SYSTEM_PROMPT = "Check the answer against the document."
# How a judgement reaches its verdict (`judgement_text`): "echo" (the recipe's) copies it, "check" compares each
# answer with the document in turn.
JUDGEMENT_STYLES = ("echo", "check")


def judgement_text(document_value: str, shown_answers: Sequence[str], style: str = "echo") -> str:
    """A pairwise judgement that reasons in short steps before the verdict `[[A]]`/`[[B]]` (upstream's format,
    parsed by `evaluation.prompts`). `shown_answers` are the one-key answers in the order shown (`The password of
    the blue door is quartz.`).

    `style="echo"`: the document's password, the answers' passwords each followed by its letter and the letter
    again in brackets, then the document's password once more, followed by the letter of the answer that states
    it and that letter as the verdict:
    `The document says quartz. The answers: orchid A [A], quartz B [B]. The document says quartz B [[B]]`.
    Every step is a copy, and each copy is one that a needle-QA model runs already or learns from the judgement
    itself:
    - the document's password: the needle look-up the LM was trained for;
    - the listed passwords: copies from the answers' fixed places in the prompt;
    - the letter after the document's password: the letter that followed the same password in the list, an
      induction copy, the circuit of the LM's look-up (learned where a comparison of two passwords was not);
    - the verdict: the letter before it, a copy that the list's `A [A]` teaches twice per judgement. Without
      the echo the judge wrote the right letter and then a verdict at chance (`quartz B. [[A]]`): at step 500,
      87% right letters and 50% right verdicts (docs/benchmarks.md, "judgements that decide by copying").

    `style="check"`: each answer restated in the needle sentence with whether its password is the document's:
    `The document says quartz. Assistant A: the password of the blue door is quartz as the document. Assistant B:
    the password of the blue door is orchid, not the document. [[A]]` (learned in 800-1,300 steps, where the echo
    judgement takes about 500).

    Given the true value it is the right judgement; `misjudgement_text` is the wrong one.
    """
    values = [_answer_value(answer) for answer in shown_answers]
    verdicts = [position_letter(i) for i, value in enumerate(values) if value == document_value]
    if len(verdicts) != 1:
        raise ValueError(f"judgement_text: exactly one answer must state {document_value!r}, got {values}")
    if style == "echo":
        return _echo_judgement(document_value, values, verdicts[0])
    steps = [_checked_answer(i, answer, document_value) for i, answer in enumerate(shown_answers)]
    return f"The document says {document_value}. " + " ".join(steps) + f" [[{verdicts[0]}]]"


def misjudgement_text(document_value: str, shown_answers: Sequence[str], style: str = "echo") -> str:
    """The judgement of `judgement_text` with every decision turned and the same quotes (the document's password
    and each answer's): `echo`, the other letter after the document's password and as the verdict
    (`... The document says quartz A [[A]]`); `check`, each comparison the wrong way and the other verdict
    (`... is quartz, not the document. Assistant B: ... is orchid as the document. [[B]]`).

    SimPO's rejected judgement. Against the right one it differs in the decisions alone, so the preference loss
    falls on them, as a DisRM's Bradley-Terry loss does on its pairs, not on quotes that SFT has already taught;
    and a held-out pair is right only when the decision is."""
    values = [_answer_value(answer) for answer in shown_answers]
    wrong = next(position_letter(i) for i, value in enumerate(values) if value != document_value)
    if style == "echo":
        return _echo_judgement(document_value, values, wrong)
    steps = [_checked_answer(i, answer, document_value, turned=True) for i, answer in enumerate(shown_answers)]
    return f"The document says {document_value}. " + " ".join(steps) + f" [[{wrong}]]"


def _echo_judgement(document_value: str, values: Sequence[str], verdict: str) -> str:
    """The `echo` judgement of the answers' passwords `values` (in the order shown) that gives `verdict`."""
    listed = ", ".join(f"{value} {position_letter(i)} [{position_letter(i)}]" for i, value in enumerate(values))
    return (f"The document says {document_value}. The answers: {listed}. The document says {document_value} "
            f"{verdict} [[{verdict}]]")


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
               count_tokens: Callable[[str], int] | None = None, style: str = "echo") -> list[dict[str, dict]]:
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


def lookup_rows(n: int, seed: str, values: Sequence[str] = VALUES) -> list[dict]:
    """`n` short SFT rows that look a letter up by a password, as the echo judgement's last copy does (the letter
    that followed the document's password in its list of answers):
    user `Pairs: sparrow B, quartz A.\n\nQuestion: Which letter follows quartz?`, target `quartz A`.

    2-4 distinct passwords per row, each followed by A or B drawn at random (so a letter never tells which
    password is asked; the same letter may follow two of them), the asked one drawn uniformly. The needle LM's own
    rows only look things up by a key (`... vault is`); blended into its pretraining, these teach the look-up
    keyed by a password before the judge's SFT needs it (docs/training.md, "The tiny recipe")."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        shown = rng.sample(list(values), rng.randint(2, 4))
        letters = [rng.choice("AB") for _ in shown]
        asked = rng.randrange(len(shown))
        pairs = ", ".join(f"{value} {letter}" for value, letter in zip(shown, letters))
        rows.append({"chat_template": [{"role": "user", "content": f"Pairs: {pairs}.\n\nQuestion: Which letter "
                                                                   f"follows {shown[asked]}?"}],
                     "golden": f"{shown[asked]} {letters[asked]}", "pairs": len(shown)})
    return rows


def write_judge_files(out_dir: str, num_train: int = 2000, num_eval: int = 200, seed: int = 0,
                      lengths: Sequence[int] = DEFAULT_LENGTHS, num_distractors: int = 0,
                      count_tokens: Callable[[str], int] | None = None, style: str = "echo") -> dict[str, str]:
    """Write, per split (`train`, `eval`), the reward-model training files of one stream of pairwise rows:
    `judge_sft_{split}.jsonl` (upstream SFT rows: GRM stage 1), `judge_{split}.jsonl` (upstream preference rows
    of judgements: GRM stage 2 SimPO, and the judge's held-out pairs) and `disrm_{split}.jsonl` (preference
    rows of answers in the benchmark's prompt: DisRM Bradley-Terry), `verify_sft_{split}.jsonl` (`verify_rows`) and
    `lookup_sft_{split}.jsonl` (`lookup_rows`: look-ups by password for the needle LM). `style`: how judgements decide
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
        paths[f"lookup_sft_{split}"] = os.path.join(out_dir, f"lookup_sft_{split}.jsonl")
        write_jsonl(paths[f"lookup_sft_{split}"], lookup_rows(n, f"lookup-{split}:{seed}"))
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
