"""Scores, upstream-layout aggregation, AUC and position-bias agreement for Long-RewardBench predictions.

A *prediction* is a dict (one line of ``predictions.jsonl``) with at least ``task`` (the task file name, e.g.
``"LongQA"``), ``tasktype`` (``"PairWise"``/``"BestOfN"``), ``subtype`` (``"same"``/``"diff"`` or
``"2"``/``"3"``/``"4"``), ``length`` (the ``ctx_length_for_length`` bucket, e.g. ``"32k"``) and ``score`` (the
sample's accuracy in [0, 1], see :func:`sample_score`).

AUC (not computed upstream; our definition). Every answer of a sample gets a scalar *preference score*:

* DisRM: the reward head's output for that answer.
* GRM: the log-probability, at the verdict position of the judge's own generation, of the letter under which
  the answer was shown (pairwise: the ``A``/``B`` inside ``[[A]]``/``[[B]]``; Best-of-N: the first letter
  of the ranking, i.e. "this answer is ranked first"). Samples without a parsable verdict, or whose verdict
  letter is not a token of its own, give every answer the same score (a tie).

From the gold order (chosen first; Best-of-N candidates best first) every sample yields preference pairs
(better, worse): one for pairwise samples, n(n-1)/2 for n candidates (Long-form: chosen vs each rejected). Each pair contributes its score
difference ``d = s_better - s_worse`` twice, as a positive (``d``, label 1) and as a negative (``-d``, label 0)
("both orientations"), and the AUC is the ROC AUC of those differences (``sklearn.metrics.roc_auc_score``): the probability that a random
positive difference exceeds a random negative one, ties counting one half. 0.5 = chance, 1.0 = every pair
ordered correctly with a consistent margin.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from sklearn.metrics import roc_auc_score

PAIRWISE = "PairWise"
BEST_OF_N = "BestOfN"
TASKTYPES = (PAIRWISE, BEST_OF_N)
DEFAULT_TASKS = ("LongQA", "Summ", "Safety", "ICL", "Cite", "Code", "Math")
LENGTH_BUCKETS = ("4k", "8k", "16k", "32k", "64k", "128k")
RANK_SIZES = (2, 3, 4)


def sample_score(gold_ranks: Sequence[int], predicted_ranks: Sequence[int]) -> float:
    """Fraction of shown positions whose predicted rank equals the gold rank; 0 without a verdict.

    Upstream semantics: positions are compared pairwise up to the shorter list, divided by the gold length.
    """
    if not predicted_ranks:
        return 0.0
    matches = sum(int(g == p) for g, p in zip(gold_ranks, predicted_ranks))
    return matches / len(gold_ranks)


def _mean(values: Sequence[float]) -> float:
    # 0.0 for an empty list (agreement counts); results rows use _group_mean, which keeps "no samples" apart.
    return float(sum(values)) / max(len(values), 1)


def _group_mean(values: Sequence[float]) -> float | None:
    # Upstream divides by max(n, 1) and so prints 0.0 for a group without samples, indistinguishable from a
    # judge that got every sample wrong; we report None (an empty cell) instead.
    return float(sum(values)) / len(values) if values else None


# Share of judgements without a parsable verdict above which the evaluation warns loudly.
UNPARSABLE_WARN_SHARE = 0.05


def verdict_report(predictions: Iterable[Mapping]) -> dict | None:
    """Count of GRM judgements (every judged order) whose output held no parsable verdict, and their share.

    Such a judgement scores 0 and ties in the AUC, so a judge that never answers in the expected format looks
    like a bad judge rather than a broken one; the count says which. None for DisRM predictions (no verdicts).
    """
    judgements = []
    for pred in predictions:
        if "verdict" not in pred:
            continue
        judgements += [o.get("verdict") for o in pred["orders"]] if pred.get("orders") else [pred["verdict"]]
    if not judgements:
        return None
    missing = sum(v is None for v in judgements)
    return {"unparsable": missing, "judgements": len(judgements), "share": round(missing / len(judgements), 5)}


def results_rows(predictions: Iterable[Mapping],
                 tasks: Sequence[str] = DEFAULT_TASKS) -> list[tuple[str, float | None]]:
    """The upstream ``results.csv`` rows, in order, as (label, value) with values rounded to 5 decimals.

    Rows: the pairwise accuracy per task, ``Same.``, ``Diff.`` (pairwise by subtype; anything not ``"same"``
    counts as diff), ``PairWise Avg.``, ``Rank2``..``Rank4`` (Best-of-N by candidate count), ``Rank Avg.``,
    the pairwise accuracy per length bucket ``4k``..``128k``, and ``AVG.`` over every sample of both formats.
    Upstream labels the Best-of-N average ``"Rank Avg,"`` (a typo); we write ``"Rank Avg."``. A row whose
    group has no samples keeps its place with the value None (upstream: 0.0); every average is over samples,
    so an empty group never enters one.
    """
    preds = list(predictions)
    pairwise = [p for p in preds if p["tasktype"] == PAIRWISE]
    best_of_n = [p for p in preds if p["tasktype"] == BEST_OF_N]
    rows: list[tuple[str, float | None]] = []
    for task in tasks:
        rows.append((task, _group_mean([p["score"] for p in pairwise if p["task"] == task])))
    rows.append(("Same.", _group_mean([p["score"] for p in pairwise if str(p["subtype"]) == "same"])))
    rows.append(("Diff.", _group_mean([p["score"] for p in pairwise if str(p["subtype"]) != "same"])))
    rows.append(("PairWise Avg.", _group_mean([p["score"] for p in pairwise])))
    for size in RANK_SIZES:
        rows.append((f"Rank{size}", _group_mean([p["score"] for p in best_of_n if str(p["subtype"]) == str(size)])))
    rows.append(("Rank Avg.", _group_mean([p["score"] for p in best_of_n])))
    for bucket in LENGTH_BUCKETS:
        rows.append((bucket, _group_mean([p["score"] for p in pairwise if p["length"] == bucket])))
    rows.append(("AVG.", _group_mean([p["score"] for p in preds])))
    return [(label, None if value is None else round(value, 5)) for label, value in rows]


def write_results_csv(rows: Sequence[tuple[str, float | None]], path) -> None:
    """Write rows like upstream's pandas ``DataFrame.to_csv``: header ``,Task,Value`` then ``i,label,value``
    (None: an empty value, as pandas writes NaN)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["", "Task", "Value"])
        for index, (label, value) in enumerate(rows):
            writer.writerow([index, label, "" if value is None else repr(float(value))])


def roc_auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """``sklearn.metrics.roc_auc_score`` of ``scores`` for binary ``labels`` (1 = positive), ties counting one
    half; NaN (instead of scikit-learn's error) when one class is absent, so an empty group reports ``None``."""
    labels = np.asarray(labels).astype(bool)
    if labels.all() or not labels.any():
        return float("nan")
    auc = roc_auc_score(labels, np.asarray(scores, dtype=np.float64))
    # With ties counting one half the AUC is exactly k / (2 n_pos n_neg) for an integer k (the Mann-Whitney U
    # doubled). scikit-learn reaches it through a trapezoid sum that can land one ulp off, which flips the
    # 5-decimal rounding of results.json on halfway values; snapping to the exact fraction keeps it stable.
    pairs2 = 2 * int(labels.sum()) * int((~labels).sum())
    return round(float(auc) * pairs2) / pairs2


def preference_differences(answer_scores: Sequence[float], answer_ranks: Sequence[int] | None = None) -> list[float]:
    """``s_better - s_worse`` for every gold pair of one sample.

    ``answer_scores`` and ``answer_ranks`` (gold rank per answer, 0 = best) are in the same order; without ranks
    the answers are taken as strictly ordered best first. Answers of equal gold rank (Long-form's rejected
    ones) form no pair.
    """
    ranks = list(range(len(answer_scores))) if answer_ranks is None else list(answer_ranks)
    return [
        float(answer_scores[i]) - float(answer_scores[j])
        for i in range(len(answer_scores))
        for j in range(len(answer_scores))
        if ranks[i] < ranks[j]
    ]


def answer_gold_ranks(prediction: Mapping) -> list[int] | None:
    """Gold rank of each answer in stored order, from a prediction's shown order and per-position gold ranks."""
    shown, gold = prediction.get("shown_order"), prediction.get("gold_ranks")
    if shown is None or gold is None:
        return None
    ranks = [0] * len(shown)
    for position, answer in enumerate(shown):
        ranks[answer] = gold[position]
    return ranks


def pair_auc(differences: Sequence[float]) -> float:
    """AUC of preference differences in both orientations (see the module docstring)."""
    diffs = np.asarray(differences, dtype=np.float64)
    if diffs.size == 0:
        return float("nan")
    scores = np.concatenate([diffs, -diffs])
    labels = np.concatenate([np.ones(diffs.size, int), np.zeros(diffs.size, int)])
    return roc_auc(scores, labels)


def auc_report(predictions: Iterable[Mapping], tasks: Sequence[str] = DEFAULT_TASKS) -> dict[str, float]:
    """AUC overall, per format and per task, from each prediction's ``answer_scores`` (gold order).

    Predictions without ``answer_scores`` are skipped. NaN values become ``None`` for JSON.
    """
    groups: dict[str, list[float]] = {"overall": [], PAIRWISE: [], BEST_OF_N: []}
    groups.update({task: [] for task in tasks})
    for pred in predictions:
        scores = pred.get("answer_scores")
        if scores is None:
            continue
        diffs = preference_differences(scores, answer_gold_ranks(pred))
        groups["overall"] += diffs
        groups.setdefault(pred["tasktype"], []).extend(diffs)
        groups.setdefault(pred["task"], []).extend(diffs)
    report = {}
    for name, diffs in groups.items():
        value = pair_auc(diffs)
        report[name] = None if np.isnan(value) else round(value, 5)
    return report


def preferred_answer_order(shown_order: Sequence[int], ranks: Sequence[int]) -> tuple[int, ...] | None:
    """Map per-position predicted ranks back to answers: the answer indices (file order) best first.

    ``None`` without a verdict. Positions ranked beyond the shown answers are ignored.
    """
    if not ranks:
        return None
    positions = sorted(range(min(len(ranks), len(shown_order))), key=lambda p: ranks[p])
    return tuple(shown_order[p] for p in positions)


def agreement_report(predictions: Iterable[Mapping]) -> dict[str, float | int | None]:
    """Position-bias summary over predictions judged in several orders (``orders`` key, see runner).

    ``orders`` is a list of {"shown_order", "ranks", "score"}; the first is the default seeded permutation.
    Reported: ``agreement`` = fraction of samples whose every order yields the same full answer ranking (a
    missing verdict never agrees); ``top1_agreement`` = same best answer in every order;
    ``mean_accuracy_all_orders`` = the sample score averaged over orders then samples (position-debiased);
    ``accuracy_default_order`` for comparison; and per format counts.
    """
    judged = [p for p in predictions if len(p.get("orders") or []) > 1]
    if not judged:
        return {"samples": 0, "agreement": None, "top1_agreement": None,
                "mean_accuracy_all_orders": None, "accuracy_default_order": None}
    full, top1, mean_acc, default_acc = [], [], [], []
    for pred in judged:
        rankings = [preferred_answer_order(o["shown_order"], o["ranks"]) for o in pred["orders"]]
        complete = all(r is not None for r in rankings)
        full.append(complete and len(set(rankings)) == 1)
        top1.append(complete and len({r[0] for r in rankings}) == 1)
        mean_acc.append(_mean([o["score"] for o in pred["orders"]]))
        default_acc.append(pred["orders"][0]["score"])
    report: dict[str, float | int | None] = {
        "samples": len(judged),
        "agreement": round(_mean(full), 5),
        "top1_agreement": round(_mean(top1), 5),
        "mean_accuracy_all_orders": round(_mean(mean_acc), 5),
        "accuracy_default_order": round(_mean(default_acc), 5),
    }
    for tasktype in TASKTYPES:
        subset = [f for f, p in zip(full, judged) if p["tasktype"] == tasktype]
        report[f"agreement_{tasktype}"] = round(_mean(subset), 5) if subset else None
    return report


def counts_by_length(predictions: Iterable[Mapping]) -> dict[str, dict[str, dict[str, int]]]:
    """Per task and overall (``"All"``) per length bucket: ``{"n": samples, "unparsable": samples whose judgement
    held no parsable verdict}`` (scored 0: an accuracy made of them measures the output format, not the judge)."""
    table: dict[str, dict[str, dict[str, int]]] = {}
    for pred in predictions:
        missing = int("verdict" in pred and pred["verdict"] is None)
        for key in (pred["task"], "All"):
            cell = table.setdefault(key, {}).setdefault(pred["length"], {"n": 0, "unparsable": 0})
            cell["n"] += 1
            cell["unparsable"] += missing
    return table


def accuracy_by_length(predictions: Iterable[Mapping], both_orders: bool = False) -> dict[str, dict[str, float]]:
    """Mean sample score per task and overall (key ``"All"``) per length bucket, both formats together.

    ``both_orders``: each sample's score is its mean over the orders it was judged in (``orders``), the
    figure the console and results.json call ``both_orders_accuracy``; otherwise the seeded order's."""
    table: dict[str, dict[str, list[float]]] = {}
    for pred in predictions:
        orders = pred.get("orders") or []
        value = _mean([o["score"] for o in orders]) if both_orders and orders else pred["score"]
        for key in (pred["task"], "All"):
            table.setdefault(key, {}).setdefault(pred["length"], []).append(value)
    return {key: {b: _mean(v) for b, v in buckets.items()} for key, buckets in table.items()}
