"""The needle-in-a-haystack generator behind every synthetic file (data.synthetic, data.synthetic_judge): filler
sentences that never mention keys or passwords, needle facts ("The password of the blue vault is falcon.") at random
depths, the answers and the Long-RewardBench row built from them, and the tiny tokenizer's corpus."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Callable, Sequence

from longrm_jax.data.records import BEST_OF_N, PAIRWISE
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
    from tokenizers import Tokenizer  # only when the committed tokenizer is present

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


def write_jsonl(path: str, rows: Sequence[dict]) -> None:
    """Write ``rows`` as JSON lines, atomically (a temporary file renamed over ``path``)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


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
