"""Synthetic long-context preference data that can only be judged by reading the context.

A *needle* fact ("The password of the blue vault is falcon.") sits at a random depth of a haystack of filler
sentences (which never mention keys or passwords). The question asks for the password; the chosen answer
states the true value, each rejected answer a different value from the same small set, in the same words,
so chosen and rejected have the same template and token length: nothing but the context separates them.
`num_distractors > 0` adds facts about other keys (harder: the key must be matched too).

Writers (deterministic by seed):
- `write_training_files(out_dir, ...)`: `{train,eval}.jsonl` in the upstream preference format
  (`chat_template` messages, `chosen` str, `rejects` list) and `sft_{train,eval}.jsonl` in the upstream SFT
  format (`chat_template`, `golden`).
- `write_long_rewardbench(out_dir, ...)`: `{Task}.jsonl` Long-RewardBench task files with every field of
  docs/upstream.md ("Long-RewardBench"). Pairwise rows ask for one password; Best-of-N rows with n candidates ask for n-1
  passwords and candidate j (best first) gets n-1-j of them right (`candidates_score` = number right).
- `write_judge_files(out_dir, ...)`: training files for a *generative* judge (GRM stage 1 SFT, stage 2 SimPO).
  Each row is a pairwise Long-RewardBench row (the same generator as the benchmark) shown to the judge in the
  evaluator's exact judge prompt (`data.judge_prompts`, answers in a random order); the target judgement names
  the answer whose password the document states and ends with the verdict the evaluator parses
  (`judgement_text`). SimPO's rejected judgement names the other answer.

CLI: `python -m longrm_jax.data.synthetic --out DIR [--num-train N] [--lengths 32,64,128,256] ...`.
Lengths are context lengths in tokens of `count_tokens` (default: the committed tiny tokenizer).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
from collections.abc import Callable, Sequence

from longrm_jax.cli_support import InputError, add_debug_flag, run_cli
from longrm_jax.data.judge_prompts import judge_messages, judge_system_prompt, position_letter
from longrm_jax.data.records import BEST_OF_N, LONG_REWARDBENCH_TASKS, PAIRWISE
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR

COLORS = ("blue", "red", "green", "yellow", "black", "white", "silver", "golden")
OBJECTS = ("vault", "gate", "locker", "chest", "door", "safe", "cabinet", "tower")
VALUES = ("falcon", "maple", "river", "copper", "lantern", "orchid", "thunder", "pebble",
          "harbor", "violet", "canyon", "ember", "glacier", "meadow", "sparrow", "quartz")

_SUBJECTS = ("the farmer", "a teacher", "the old sailor", "my neighbor", "the child", "a traveler",
             "the baker", "the doctor", "a musician", "the gardener", "the student", "a painter")
_VERBS = ("walked to", "looked at", "talked about", "carried", "cleaned", "visited", "painted",
          "remembered", "described", "repaired", "found", "watched")
_PLACES = ("the market", "the small house", "the quiet park", "the library", "the station", "the bridge",
           "the kitchen", "the hill", "the school", "the museum", "the forest", "the beach")
_TIMES = ("in the morning", "after lunch", "before the rain", "at night", "on sunday", "every week",
          "last year", "in spring", "during the storm", "at noon", "in the evening", "later")

# Context lengths (tokens) of the tiny default: short enough for a tiny model to learn the retrieval quickly
# (measured: a 2-layer d=64 model reaches >90% held-out in ~1000 steps at 64-128 tokens), spread over
# buckets; a chosen+rejected group of the longest fits a 1024-token row.
DEFAULT_LENGTHS = (32, 64, 128, 256)

SYSTEM_PROMPT = "You are a careful assistant. Answer the question using only the document."


def filler_sentence(rng: random.Random) -> str:
    s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_PLACES)} {rng.choice(_TIMES)}."
    return s[0].upper() + s[1:]


def fact_sentence(key: tuple[str, str], value: str) -> str:
    return f"The password of the {key[0]} {key[1]} is {value}."


def answer_text(keys: Sequence[tuple[str, str]], values: Sequence[str]) -> str:
    return " ".join(fact_sentence(k, v) for k, v in zip(keys, values))


def question_text(keys: Sequence[tuple[str, str]]) -> str:
    names = " and of the ".join(f"{c} {o}" for c, o in keys)
    return f"What is the password of the {names}?"


def approx_token_count(text: str) -> int:
    """Fallback length estimate (about 1.3 tokens per word for the tiny tokenizer)."""
    return int(len(text.split()) * 1.3) + 1


def default_token_counter() -> Callable[[str], int]:
    """Token counter of the committed tiny tokenizer (falls back to a word estimate if it is missing)."""
    if not os.path.exists(os.path.join(TINY_TOKENIZER_DIR, "tokenizer.json")):
        return approx_token_count
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(TINY_TOKENIZER_DIR, "tokenizer.json"))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def length_label(tokens: int) -> str:
    """Bucket label in the Long-RewardBench style ("4k", "32k"); small lengths as plain numbers ("256")."""
    return f"{tokens // 1024}k" if tokens >= 1024 else str(tokens)


@dataclasses.dataclass(frozen=True)
class NeedleSample:
    context: str
    keys: tuple[tuple[str, str], ...]  # asked keys
    values: tuple[str, ...]  # their true values
    depths: tuple[float, ...]  # relative position of each asked fact in the haystack
    context_tokens: int
    target_tokens: int

    def messages(self) -> list[dict[str, str]]:
        user = f"Document:\n{self.context}\n\nQuestion: {question_text(self.keys)}"
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def make_needle_sample(rng: random.Random, target_tokens: int, num_asked: int = 1, num_distractors: int = 0,
                       count_tokens: Callable[[str], int] = approx_token_count,
                       values: Sequence[str] = VALUES) -> NeedleSample:
    """A haystack of about `target_tokens` tokens holding `num_asked` asked facts and distractor facts."""
    all_keys = [(c, o) for c in COLORS for o in OBJECTS]
    keys = rng.sample(all_keys, num_asked + num_distractors)
    pool = values
    values = [rng.choice(pool) for _ in keys]
    facts = [fact_sentence(k, v) for k, v in zip(keys, values)]
    budget = target_tokens - sum(count_tokens(f) + 1 for f in facts)
    sentences: list[str] = []
    used = 0
    while True:
        s = filler_sentence(rng)
        cost = count_tokens(" " + s)
        if used + cost > budget and sentences:
            break
        sentences.append(s)
        used += cost
    slots = sorted(rng.randint(0, len(sentences)) for _ in facts)
    order = list(range(len(facts)))
    rng.shuffle(order)
    depths: dict[int, float] = {}
    for offset, (slot, fact_idx) in enumerate(zip(slots, order)):
        sentences.insert(slot + offset, facts[fact_idx])
        depths[fact_idx] = (slot + offset) / max(1, len(sentences) - 1)
    context = " ".join(sentences)
    return NeedleSample(context=context, keys=tuple(keys[:num_asked]), values=tuple(values[:num_asked]),
                        depths=tuple(depths[i] for i in range(num_asked)),
                        context_tokens=count_tokens(context), target_tokens=target_tokens)


def wrong_values(rng: random.Random, true_value: str, n: int, values: Sequence[str] = VALUES) -> list[str]:
    return rng.sample([v for v in values if v != true_value], n)


def preference_row(rng: random.Random, target_tokens: int, num_rejects: int = 1, num_distractors: int = 0,
                   count_tokens: Callable[[str], int] = approx_token_count, values: Sequence[str] = VALUES
                   ) -> dict:
    """One upstream-format preference row (`chat_template`, `chosen`, `rejects`) plus provenance fields."""
    s = make_needle_sample(rng, target_tokens, 1, num_distractors, count_tokens, values)
    rejects = [answer_text(s.keys, [v]) for v in wrong_values(rng, s.values[0], num_rejects, values)]
    return {
        "chat_template": s.messages(),
        "chosen": answer_text(s.keys, s.values),
        "rejects": rejects,
        "ctx_length": length_label(target_tokens),
        "prompt_ctx_length": s.context_tokens,
        "depth": round(s.depths[0], 4),
        "key": " ".join(s.keys[0]),
        "answer": s.values[0],
    }


def sft_row(pref: dict) -> dict:
    return {"chat_template": pref["chat_template"], "golden": pref["chosen"], "ctx_length": pref["ctx_length"],
            "depth": pref["depth"]}


def bench_row(rng: random.Random, task: str, index: int, target_tokens: int, num_candidates: int,
              count_tokens: Callable[[str], int] = approx_token_count, num_distractors: int = 0,
              best_of_n: bool | None = None) -> dict:
    """One Long-RewardBench row: PairWise (2 candidates) or BestOfN (`best_of_n`, default: more than 2)."""
    pairwise = not (num_candidates > 2 if best_of_n is None else best_of_n)
    if pairwise and num_candidates != 2:
        raise ValueError("a pairwise row has 2 candidates")
    num_asked = 1 if pairwise else num_candidates - 1
    s = make_needle_sample(rng, target_tokens, num_asked, num_distractors, count_tokens)
    candidates = []
    for j in range(num_candidates):
        n_wrong = num_asked if pairwise and j == 1 else j
        wrong_at = set(rng.sample(range(num_asked), n_wrong))
        vals = [wrong_values(rng, v, 1)[0] if i in wrong_at else v for i, v in enumerate(s.values)]
        candidates.append(answer_text(s.keys, vals))
    messages = [{"role": "user", "content": s.messages()[1]["content"]}]
    words = len(s.context.split())
    row = {
        "id": f"synthetic-{task}-{index}",
        "prompt_template": messages,
        "question": question_text(s.keys),
        "source": "synthetic-needle",
        "task": task,
        "subtask": "needle",
        "tasktype": PAIRWISE if pairwise else BEST_OF_N,
        "subtype": "same" if pairwise else str(num_candidates),
        "chosen": candidates[0] if pairwise else None,
        "rejected": candidates[1] if pairwise else None,
        "chosen_model": "synthetic" if pairwise else None,
        "rejected_model": "synthetic" if pairwise else None,
        "candidates": None if pairwise else candidates,
        "candidates_model": None if pairwise else ["synthetic"] * num_candidates,
        "candidates_score": None if pairwise else [float(num_asked - j) for j in range(num_candidates)],
        "ctx_length_for_length": length_label(target_tokens),
        "ctx_length_for_words": length_label(words),
        "length": s.context_tokens,
        "words_count": words,
        "depth": [round(d, 4) for d in s.depths],
    }
    return row


def _write_jsonl(path: str, rows: Sequence[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def training_rows(n: int, seed: int, lengths: Sequence[int], num_rejects: int = 1, num_distractors: int = 0,
                  count_tokens: Callable[[str], int] | None = None, num_values: int = len(VALUES)) -> list[dict]:
    """`n` preference rows, context lengths cycling through `lengths` (tokens).

    `num_values` (2..16) restricts the passwords to the first values of `VALUES` (an easier task).
    """
    if not num_rejects + 1 <= num_values <= len(VALUES):
        raise ValueError(f"num_values must be in [{num_rejects + 1}, {len(VALUES)}], got {num_values}")
    count_tokens = count_tokens or default_token_counter()
    rng = random.Random(seed)
    return [preference_row(rng, lengths[i % len(lengths)], num_rejects, num_distractors, count_tokens,
                           VALUES[:num_values]) for i in range(n)]


def write_training_files(out_dir: str, num_train: int = 2000, num_eval: int = 200, seed: int = 0,
                         lengths: Sequence[int] = DEFAULT_LENGTHS, num_rejects: int = 1,
                         num_distractors: int = 0, count_tokens: Callable[[str], int] | None = None,
                         num_values: int = len(VALUES)) -> dict[str, str]:
    """Write preference (`train.jsonl`, `eval.jsonl`) and SFT (`sft_train.jsonl`, `sft_eval.jsonl`) files.

    The eval split uses a different seed stream, so it is held out. Returns {name: path}.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, n, split_seed in (("train", num_train, seed), ("eval", num_eval, seed + 1_000_003)):
        rows = training_rows(n, split_seed, lengths, num_rejects, num_distractors, count_tokens, num_values)
        paths[split] = os.path.join(out_dir, f"{split}.jsonl")
        paths[f"sft_{split}"] = os.path.join(out_dir, f"sft_{split}.jsonl")
        _write_jsonl(paths[split], rows)
        _write_jsonl(paths[f"sft_{split}"], [sft_row(r) for r in rows])
    return paths


def judgement_text(document_value: str, shown_answers: Sequence[str]) -> str:
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
    """
    values = [_answer_value(answer) for answer in shown_answers]
    verdicts = [position_letter(i) for i, value in enumerate(values) if value == document_value]
    if len(verdicts) != 1:
        raise ValueError(f"judgement_text: exactly one answer must state {document_value!r}, got {values}")
    steps = []
    for i, (answer, value) in enumerate(zip(shown_answers, values)):
        sentence = answer.strip().rstrip(".")
        steps.append(f"Assistant {position_letter(i)}: {sentence[:1].lower()}{sentence[1:]}"
                     + (" as the document." if value == document_value else ", not the document."))
    return f"The document says {document_value}. " + " ".join(steps) + f" [[{verdicts[0]}]]"


def _answer_value(answer: str) -> str:
    """The password that a one-key answer (`The password of the blue vault is falcon.`) states."""
    return answer.rstrip(".").split()[-1]


def judge_rows(n: int, seed: str, lengths: Sequence[int], num_distractors: int = 0,
               count_tokens: Callable[[str], int] | None = None) -> list[dict[str, dict]]:
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
        good = judgement_text(_answer_value(row["chosen"]), shown)
        bad = judgement_text(_answer_value(row["rejected"]), shown)
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
    """`n` needle *verification* SFT rows: the question names a candidate password ("Is the password of the blue
    door falcon?"), half of them the document's, and the answer starts with the decision, then states the
    document's password (`No, the password of the blue door is quartz.`). Pretraining rows for the tiny judges:
    they teach the comparison "is this password the document's?" that every judgement needs, outside the judge
    prompt (no answer letters, no verdicts)."""
    count_tokens = count_tokens or default_token_counter()
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        target = lengths[i % len(lengths)]
        s = make_needle_sample(rng, target, 1, num_distractors, count_tokens)
        key, value = s.keys[0], s.values[0]
        right = rng.randrange(2) == 1
        candidate = value if right else wrong_values(rng, value, 1)[0]
        user = f"Document:\n{s.context}\n\nQuestion: Is the password of the {key[0]} {key[1]} {candidate}?"
        golden = f"{'Yes' if right else 'No'}, the password of the {key[0]} {key[1]} is {value}."
        rows.append({"chat_template": [{"role": "system", "content": SYSTEM_PROMPT},
                                       {"role": "user", "content": user}],
                     "golden": golden, "candidate_is_right": right, "ctx_length": length_label(target),
                     "depth": round(s.depths[0], 4)})
    return rows


def write_judge_files(out_dir: str, num_train: int = 2000, num_eval: int = 200, seed: int = 0,
                      lengths: Sequence[int] = DEFAULT_LENGTHS, num_distractors: int = 0,
                      count_tokens: Callable[[str], int] | None = None) -> dict[str, str]:
    """Write, per split (`train`, `eval`), the reward-model training files of one stream of pairwise rows:
    `judge_sft_{split}.jsonl` (upstream SFT rows: GRM stage 1), `judge_{split}.jsonl` (upstream preference rows
    of judgements: GRM stage 2 SimPO, and the judge's held-out pairs) and `disrm_{split}.jsonl` (preference
    rows of answers in the benchmark's prompt: DisRM Bradley-Terry).

    Their random streams differ from every `write_long_rewardbench` stream, so a benchmark written with any seed
    is held out. Returns {name: path}.
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, n in (("train", num_train), ("eval", num_eval)):
        rows = judge_rows(n, f"judge-{split}:{seed}", lengths, num_distractors, count_tokens)
        for name, column in ((f"judge_sft_{split}", "sft"), (f"judge_{split}", "simpo"),
                             (f"disrm_{split}", "disrm")):
            paths[name] = os.path.join(out_dir, f"{name}.jsonl")
            _write_jsonl(paths[name], [item[column] for item in rows])
        paths[f"verify_sft_{split}"] = os.path.join(out_dir, f"verify_sft_{split}.jsonl")
        _write_jsonl(paths[f"verify_sft_{split}"], verify_rows(n, f"verify-{split}:{seed}", lengths, num_distractors,
                                                               count_tokens))
    return paths


def write_long_rewardbench(out_dir: str, per_task: int = 20, seed: int = 0,
                           lengths: Sequence[int] = DEFAULT_LENGTHS,
                           tasks: Sequence[str] = LONG_REWARDBENCH_TASKS, bon_fraction: float = 0.3,
                           num_distractors: int = 0, count_tokens: Callable[[str], int] | None = None
                           ) -> dict[str, str]:
    """Write `{Task}.jsonl` for each task: about `bon_fraction` Best-of-N rows (n = 2, 3, 4 cycling).

    Each task has its own random stream, named by task and seed (a string: no training-file stream, which are
    integers or other names, is the same, so the benchmark is held out from training files of any seed).
    Returns {task: path}.
    """
    count_tokens = count_tokens or default_token_counter()
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for task in tasks:
        rng = random.Random(f"bench-{task}:{seed}")
        n_bon = int(round(per_task * bon_fraction))
        rows = []
        for i in range(per_task):
            n_cand = 2 if i >= n_bon else (2, 3, 4)[i % 3]
            rows.append(bench_row(rng, task, i, lengths[i % len(lengths)], n_cand, count_tokens,
                                  num_distractors, best_of_n=i < n_bon))
        paths[task] = os.path.join(out_dir, f"{task}.jsonl")
        _write_jsonl(paths[task], rows)
    return paths


def corpus_for_tokenizer(num_rows: int = 300, seed: int = 12345) -> list[str]:
    """Texts covering every word the generators use (for training the tiny tokenizer)."""
    rng = random.Random(seed)
    roles = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
    texts = [SYSTEM_PROMPT, roles, "Document:", "Question:", "[Analysis] [Score: 10] [[A]] [[B]] [[A>B>C]]"] * 50
    for _ in range(num_rows):
        s = make_needle_sample(rng, rng.choice((64, 128, 256)), rng.randint(1, 3), rng.randint(0, 2))
        texts.append(s.messages()[1]["content"])
        texts.append(answer_text(s.keys, s.values))
    return texts


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


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_write, argv)


def _write(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m longrm_jax.data.synthetic", description="Write synthetic needle-in-a-haystack preference data "
                                "(training rows and Long-RewardBench task files).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True, default=argparse.SUPPRESS, help="output directory")
    p.add_argument("--num-train", type=int, default=2000, help="training rows (train.jsonl)")
    p.add_argument("--num-eval", type=int, default=200, help="held-out rows (eval.jsonl)")
    p.add_argument("--bench-per-task", type=int, default=20, help="rows per Long-RewardBench task file")
    p.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="context lengths in tokens, comma separated")
    p.add_argument("--num-rejects", type=int, default=1, help="rejected responses per training row")
    p.add_argument("--num-distractors", type=int, default=0, help="extra facts about other keys")
    p.add_argument("--num-values", type=int, default=len(VALUES), help="distinct passwords in training rows")
    p.add_argument("--bench-bon-fraction", type=float, default=0.3,
                   help="share of Best-of-N rows in the Long-RewardBench files (0: pairwise only)")
    p.add_argument("--judge", action="store_true",
                   help="also write judge training files: judge_sft_{train,eval}.jsonl (GRM SFT) and "
                        "judge_{train,eval}.jsonl (GRM SimPO), pairwise rows in the evaluator's judge prompt, "
                        "verify_sft_{train,eval}.jsonl (SFT rows of the judge's verification task), and "
                        "disrm_{train,eval}.jsonl (DisRM Bradley-Terry) in the benchmark's prompt")
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same files")
    add_debug_flag(p)
    args = p.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths {args.lengths!r}: expected comma-separated integers")
    # Checked before anything is written: a bad count would otherwise leave a partial set of files.
    for flag, value, least in (("--num-train", args.num_train, 0), ("--num-eval", args.num_eval, 0),
                               ("--bench-per-task", args.bench_per_task, 0), ("--num-rejects", args.num_rejects, 1),
                               ("--num-distractors", args.num_distractors, 0), ("--num-values", args.num_values, 1),
                               *(("--lengths", n, 1) for n in lengths)):
        if value < least:
            p.error(f"{flag} {value}: expected an integer >= {least}")
    if not args.num_rejects + 1 <= args.num_values <= len(VALUES):  # a rejected answer needs a wrong password
        p.error(f"--num-values {args.num_values}: expected {args.num_rejects + 1} (--num-rejects + 1) to {len(VALUES)} "
                "(the number of passwords)" if args.num_rejects + 1 <= len(VALUES) else
                f"--num-rejects {args.num_rejects}: at most {len(VALUES) - 1} (one fewer than the {len(VALUES)} "
                "passwords)")
    if not 0.0 <= args.bench_bon_fraction <= 1.0:
        p.error(f"--bench-bon-fraction {args.bench_bon_fraction}: expected a fraction in [0, 1]")
    # A file at --out (or above it) made os.makedirs raise "[Errno 17] File exists" (exit 1, no flag named).
    blocker = next((path for path in _parents(args.out) if os.path.exists(path) and not os.path.isdir(path)), None)
    if blocker is not None:
        raise InputError(f"--out {args.out}: " + ("is a file; a directory is needed (the files are written inside "
                                                  "it)" if blocker == os.path.normpath(args.out) else
                                                  f"{blocker} is a file, not a directory"))
    paths = write_training_files(args.out, args.num_train, args.num_eval, args.seed, lengths, args.num_rejects,
                                 args.num_distractors, num_values=args.num_values)
    if args.judge:
        paths.update(write_judge_files(args.out, args.num_train, args.num_eval, args.seed, lengths,
                                       args.num_distractors))
    paths.update(write_long_rewardbench(os.path.join(args.out, "long_rewardbench"), args.bench_per_task,
                                        args.seed, lengths, bon_fraction=args.bench_bon_fraction,
                                        num_distractors=args.num_distractors))
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _parents(path: str) -> list[str]:
    """``path`` and each directory above it as written, nearest first."""
    out, path = [], os.path.normpath(path)
    while path and path not in out:
        out.append(path)
        path = os.path.dirname(path)
    return out


if __name__ == "__main__":
    sys.exit(main())
