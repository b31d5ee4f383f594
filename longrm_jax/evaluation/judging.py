"""Turn model outputs into per-sample predictions: DisRM scores -> ranks, GRM generations -> verdicts.

Both produce the same prediction record (a JSON-able dict, one line of ``predictions.jsonl``), see
:func:`base_prediction`; ``score`` is the upstream sample accuracy and ``answer_scores`` (gold order) feed the
AUC of :mod:`longrm_jax.evaluation.metrics`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from longrm_jax.evaluation.grm.decoding import Generation
from longrm_jax.evaluation.metrics import sample_score
from longrm_jax.evaluation.prompts import (
    parse_verdict,
    position_letter,
    ranks_from_scores,
    verdict_letter_index,
)
from longrm_jax.evaluation.samples import LONG_FORM, EvalSample, gold_ranks


def judged_orders(sample: EvalSample, both_orders: bool) -> list[list[int]]:
    """Shown orders to judge: the seeded one, plus (``both_orders``) the swapped pair or every cyclic rotation."""
    order = list(sample.shown_order)
    if not both_orders:
        return [order]
    return [order[k:] + order[:k] for k in range(len(order))]


def is_correct(sample: EvalSample, shown_order: Sequence[int], ranks: Sequence[int]) -> bool:
    """Long-RewardBench: every position ranked right. Long-form: each chosen strictly above every rejected."""
    if not ranks:
        return False
    if sample.benchmark == LONG_FORM:
        gold = gold_ranks(sample, shown_order)
        chosen = [ranks[p] for p in range(len(gold)) if p < len(ranks) and gold[p] == 0]
        rejected = [ranks[p] for p in range(len(gold)) if p < len(ranks) and gold[p] != 0]
        return len(chosen) == sample.num_chosen and bool(rejected) and max(chosen) < min(rejected)
    return sample_score(gold_ranks(sample, shown_order), ranks) == 1.0


def order_score(sample: EvalSample, shown_order: Sequence[int], ranks: Sequence[int]) -> float:
    """Upstream partial-credit score (Long-RewardBench) or 0/1 correctness (Long-form)."""
    if sample.benchmark == LONG_FORM:
        return float(is_correct(sample, shown_order, ranks))
    return sample_score(gold_ranks(sample, shown_order), ranks)


def base_prediction(sample: EvalSample) -> dict:
    record = {
        "id": sample.id, "task": sample.task, "tasktype": sample.tasktype, "subtype": sample.subtype,
        "length": sample.length, "benchmark": sample.benchmark, "file": sample.file, "row": sample.row,
        "index": sample.index, "source": sample.source, "subtask": sample.subtask,
        "shown_order": list(sample.shown_order), "gold_ranks": gold_ranks(sample),
    }
    if sample.needle_position is not None:
        record["needle_position"] = sample.needle_position
    return record


def disrm_prediction(sample: EvalSample, scores: Sequence[float], orders: Sequence[Sequence[int]],
                     num_tokens: Sequence[int], truncated: Sequence[bool]) -> dict:
    """Prediction of a DisRM: ``scores`` one per answer in the file's stored order (best first).

    Ranking is by score in shown order with ties going to the earlier shown position (upstream's stable sort),
    so only ties depend on the shown order.
    """
    record = base_prediction(sample)
    judged = []
    for order in orders:
        ranks = ranks_from_scores([scores[i] for i in order])
        judged.append({"shown_order": list(order), "ranks": ranks, "score": order_score(sample, order, ranks),
                       "correct": is_correct(sample, order, ranks)})
    if sample.benchmark == LONG_FORM:
        # Strict comparison on the raw scores (order-independent): a tie with a rejected answer is wrong.
        strict = bool(min(scores[: sample.num_chosen]) > max(scores[sample.num_chosen:]))
        for entry in judged:
            entry.update(correct=strict, score=float(strict))
    first = judged[0]
    record.update(
        scores=[float(s) for s in scores], answer_scores=[float(s) for s in scores],
        predicted_ranks=first["ranks"], score=first["score"], correct=first["correct"],
        num_tokens=list(num_tokens), truncated=bool(any(truncated)),
    )
    if len(judged) > 1:
        record["orders"] = judged
    return record


def token_index_at_char(tokenizer, tokens: Sequence[int], char_index: int) -> int | None:
    """Index of the generated token whose decoded text covers ``char_index`` of the decoded whole.

    Binary search over decoded prefixes (decode length grows with the prefix), ~log2(n) decodes.
    """
    lo, hi = 1, len(tokens)
    if hi == 0:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(list(tokens[:mid]), skip_special_tokens=True)) > char_index:
            hi = mid
        else:
            lo = mid + 1
    if len(tokenizer.decode(list(tokens[:lo]), skip_special_tokens=True)) <= char_index:
        return None
    return lo - 1


def verdict_answer_scores(sample: EvalSample, shown_order: Sequence[int], generation: Generation, text: str,
                          tokenizer, letter_ids: Sequence[int]) -> tuple[list[float], int | None]:
    """Per-answer (gold order) log P(letter) at the verdict token; all zeros (a tie) when unavailable.

    Returns (scores, verdict token index or None).
    """
    n = len(shown_order)
    tie = [0.0] * len(sample.answers)
    char_index = verdict_letter_index(text, sample.judge_kind)
    if char_index is None or n > len(letter_ids):
        return tie, None
    letter = ord(text[char_index]) - ord("A")
    if letter >= len(letter_ids):
        return tie, None
    token_index = token_index_at_char(tokenizer, generation.tokens, char_index)
    if token_index is None or int(generation.tokens[token_index]) != letter_ids[letter]:
        return tie, None  # the letter is merged into a larger token: its probability is not a letter's
    logprobs = generation.letter_logprobs[token_index]
    scores = list(tie)
    for position, answer in enumerate(shown_order):
        value = float(logprobs[position])
        scores[answer] = value if np.isfinite(value) else -1e9
    return scores, token_index


def grm_prediction(sample: EvalSample, orders: Sequence[Sequence[int]], generations: Sequence[Generation],
                   tokenizer, letter_ids: Sequence[int], num_tokens: Sequence[int],
                   truncated: Sequence[bool]) -> dict:
    """Prediction of a GRM judged in ``orders`` (first = the seeded order) with their ``generations``."""
    record = base_prediction(sample)
    judged = []
    for order, generation in zip(orders, generations):
        text = tokenizer.decode(generation.tokens.tolist(), skip_special_tokens=True)
        ranks = parse_verdict(text, sample.judge_kind)
        answer_scores, verdict_token = verdict_answer_scores(sample, order, generation, text, tokenizer,
                                                             letter_ids)
        verdict = ">".join(position_letter(p) for p in sorted(range(len(ranks)), key=lambda p: ranks[p]))
        judged.append({
            "shown_order": list(order), "output": text, "verdict": verdict or None, "ranks": ranks,
            "score": order_score(sample, order, ranks), "correct": is_correct(sample, order, ranks),
            "answer_scores": answer_scores, "verdict_token": verdict_token,
            "generated_tokens": int(len(generation.tokens)), "stopped": generation.stopped,
        })
    first = judged[0]
    record.update(
        output=first["output"], verdict=first["verdict"], predicted_ranks=first["ranks"], score=first["score"],
        correct=first["correct"], answer_scores=first["answer_scores"], generated_tokens=first["generated_tokens"],
        stopped=first["stopped"], num_tokens=list(num_tokens), truncated=bool(any(truncated)),
    )
    if len(judged) > 1:
        record["orders"] = judged
    return record
