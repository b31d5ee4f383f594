"""Long-form RewardBench by its own protocol: responses judged one at a time, binary and best-of-N accuracy.

The Long-form RewardBench code scores each (prompt, response) on its own and compares the scores:

* **Generative RMs** (``pointwise``, the default for Long-form files): the judge sees the user prompt and *one*
  response and writes an evaluation ending in ``**Result:** x.y``, a score from 1.0 to 10.0; the last such line
  of the output is the response's score (no line: unparsable, the response loses every comparison). Our judge
  prompts (``POINTWISE_SYSTEM_PROMPT`` / ``pointwise_messages``) are written here from that description; they are
  not the repository's wording. ``--longform-protocol joint`` keeps the Long-RewardBench style joint ranking of all
  answers in one prompt instead.
* **Discriminative RMs**: the head's score of each templated (prompt, response), as for Long-RewardBench.

Metrics per subset and overall (rows of ``results.csv``):

* ``{subset}``: best-of-N accuracy (best-of-4: 1 chosen vs 3 rejected; Reasoning is 1 vs 1): the chosen score is
  strictly above every rejected one (ties wrong).
* ``{subset} Binary``: per-pair binary accuracy, pooled over every (chosen, rejected) pair of the subset: the chosen
  score strictly above that rejected one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from longrm_jax.evaluation.samples import LONG_FORM, EvalSample

POINTWISE_SYSTEM_PROMPT = (
    "You are an impartial and careful evaluator of long responses. You will be shown a user's request and one "
    "response written by an AI assistant. Judge how well the response fulfils the request: whether it is correct "
    "and faithful to the request and any material it contains, complete, coherent from beginning to end, and "
    "useful. Long responses may hide an error or an irrelevant passage anywhere, so read the whole response "
    "before judging, and do not let its length or style sway you. First explain your evaluation briefly, then "
    "give a score from 1.0 (very poor) to 10.0 (excellent) with one decimal, on the last line, exactly in this "
    "format:\n**Result:** x.y"
)

_RESULT_RE = re.compile(r"\*\*Result:?\*\*:?\s*\[*\s*(-?\d+(?:\.\d+)?)")


def pointwise_messages(prompt: str, response: str) -> list[dict]:
    """Chat messages [system, user] asking a GRM to score one ``response`` to ``prompt``."""
    user = (f"[User Request]\n{prompt}\n\n[The Start of the Assistant's Response]\n{response}\n"
            "[The End of the Assistant's Response]\n\nEvaluate the response and end with the line "
            "\"**Result:** x.y\".")
    return [{"role": "system", "content": POINTWISE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_result(text: str) -> float | None:
    """The score of the last ``**Result:** x.y`` in ``text``; None when there is none."""
    found = _RESULT_RE.findall(text)
    return float(found[-1]) if found else None


def pair_outcomes(scores: Sequence[float | None], chosen: Sequence[bool]) -> list[bool]:
    """For every (chosen, rejected) pair: the chosen score strictly above the rejected one (None loses)."""
    good = [s for s, c in zip(scores, chosen) if c]
    bad = [s for s, c in zip(scores, chosen) if not c]
    return [c is not None and (r is None or c > r) for c in good for r in bad]


def _chosen_flags(prediction: dict) -> list[bool]:
    """Chosen flags in the stored (gold) order of ``scores``: the first answers, as many as gold rank 0 has."""
    num_chosen = sum(rank == 0 for rank in prediction["gold_ranks"])  # gold_ranks is in shown order
    return [i < num_chosen for i in range(len(prediction["gold_ranks"]))]


def binary_outcomes(prediction: dict) -> list[bool]:
    """Pair outcomes of a Long-form prediction holding per-answer ``scores`` in gold order (both RM kinds)."""
    return pair_outcomes(prediction["scores"], _chosen_flags(prediction))


def best_of_n_correct(scores: Sequence[float | None], chosen: Sequence[bool]) -> bool:
    return all(pair_outcomes(scores, chosen)) and any(chosen) and not all(chosen)


def summary_rows(predictions: Sequence[dict]) -> list[tuple[str, float]]:
    """``({subset}, best-of-N accuracy)``, ``({subset} Binary, pair accuracy)`` per subset, then ``AVG.`` and
    ``AVG. Binary`` (over all records / all pairs). Binary rows need per-answer scores (DisRM, pointwise GRM)."""
    subsets = list(dict.fromkeys(p["task"] for p in predictions))
    rows = []

    def add(label: str, group: list[dict]) -> None:
        rows.append((label, round(float(np.mean([p["correct"] for p in group])), 5)))
        if all("scores" in p for p in group):
            pairs = [o for p in group for o in binary_outcomes(p)]
            rows.append((f"{label} Binary", round(float(np.mean(pairs)), 5) if pairs else 0.0))

    for subset in subsets:
        add(subset, [p for p in predictions if p["task"] == subset])
    add("AVG.", list(predictions))
    return rows


def pointwise_prompt_ids(sample: EvalSample, tokenizer, answer: int, max_length: int | None):
    """(ids, truncated) of the judge prompt for answer ``answer`` (gold order) of a Long-form sample."""
    from longrm_jax.evaluation.encoding import maybe_truncate

    text = tokenizer.render(pointwise_messages(sample.prompt or "", sample.answers[answer]),
                            add_generation_prompt=True)
    return maybe_truncate(np.asarray(tokenizer.encode(text), dtype=np.int32), max_length)


def pointwise_prediction(sample: EvalSample, outputs: Sequence[str], num_tokens: Sequence[int],
                         truncated: Sequence[bool]) -> dict:
    """Prediction of a GRM that judged each answer of ``sample`` (gold order) on its own."""
    from longrm_jax.evaluation.judging import base_prediction

    record = base_prediction(sample)
    scores = [parse_result(text) for text in outputs]
    chosen = [i < sample.num_chosen for i in range(len(sample.answers))]
    correct = best_of_n_correct(scores, chosen)
    record.update(protocol="pointwise", outputs=list(outputs), scores=scores, correct=correct,
                  score=float(correct), num_unparsable=sum(s is None for s in scores),
                  # AUC input: an unparsable response ranks below every parsed one
                  answer_scores=[-1e9 if s is None else float(s) for s in scores],
                  num_tokens=list(num_tokens), truncated=bool(any(truncated)))
    return record


def run_pointwise_grm(cfg, samples: list[EvalSample], model, tokenizer, mesh) -> list[dict]:
    """Judge every answer of every Long-form sample on its own (greedy, ``cfg.max_new_tokens``)."""
    from longrm_jax.evaluation.grm_generation import add_timings, make_generator, simulated_budgets

    if any(s.benchmark != LONG_FORM for s in samples):
        raise ValueError("the pointwise protocol is for Long-form RewardBench records")
    prompts, owners, cuts = [], [], []
    for s_index, sample in enumerate(samples):
        for answer in range(len(sample.answers)):
            ids, cut = pointwise_prompt_ids(sample, tokenizer, answer, cfg.max_length)
            prompts.append(ids)
            owners.append(s_index)
            cuts.append(cut)
    generator = make_generator(cfg, model, tokenizer, mesh)
    generations = generator.generate(prompts, progress=cfg.progress, budgets=simulated_budgets(cfg, prompts))
    add_timings(cfg, generator.timings)
    texts = [tokenizer.hf.decode(g.tokens.tolist(), skip_special_tokens=True) for g in generations]
    predictions = []
    for s_index, sample in enumerate(samples):
        members = [i for i, owner in enumerate(owners) if owner == s_index]
        predictions.append(pointwise_prediction(sample, [texts[i] for i in members],
                                                [len(prompts[i]) for i in members], [cuts[i] for i in members]))
    return predictions

