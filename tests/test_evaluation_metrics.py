"""results.csv aggregation on hand-built predictions, AUC against scikit-learn, agreement, plots."""

import csv
import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from longrm_jax.evaluation import metrics, plots


def _pred(task, tasktype, subtype, length, score, **extra):
    return dict(task=task, tasktype=tasktype, subtype=subtype, length=length, score=score, **extra)


HAND_BUILT = [
    _pred("LongQA", "PairWise", "same", "4k", 1.0),
    _pred("LongQA", "PairWise", "diff", "8k", 0.0),
    _pred("LongQA", "PairWise", "diff", "8k", 1.0),
    _pred("Summ", "PairWise", "same", "128k", 1.0),
    _pred("Summ", "BestOfN", "3", "16k", 1 / 3),
    _pred("Code", "BestOfN", "2", "4k", 1.0),
    _pred("Code", "BestOfN", "4", "32k", 0.5),
    _pred("Code", "BestOfN", "4", "32k", 0.0),
]


def test_sample_score_upstream_semantics():
    assert metrics.sample_score([1, 0], [1, 0]) == 1.0
    assert metrics.sample_score([1, 0], [0, 1]) == 0.0
    assert metrics.sample_score([1, 0], []) == 0.0
    assert metrics.sample_score([2, 0, 1], [2, 1, 0]) == pytest.approx(1 / 3)
    assert metrics.sample_score([2, 0, 1], [2, 0]) == pytest.approx(2 / 3)  # shorter verdict: partial credit


def test_results_rows_hand_built():
    rows = dict(metrics.results_rows(HAND_BUILT))
    labels = [label for label, _ in metrics.results_rows(HAND_BUILT)]
    assert labels == ["LongQA", "Summ", "Safety", "ICL", "Cite", "Code", "Math", "Same.", "Diff.",
                      "PairWise Avg.", "Rank2", "Rank3", "Rank4", "Rank Avg.", "4k", "8k", "16k", "32k",
                      "64k", "128k", "AVG."]
    assert rows["LongQA"] == round(2 / 3, 5)
    assert rows["Summ"] == 1.0  # only the pairwise Summ sample counts
    # No pairwise Safety / Code samples: an empty value (upstream printed 0.0, as if every sample were wrong).
    assert rows["Safety"] is None and rows["Code"] is None
    assert rows["Same."] == 1.0 and rows["Diff."] == 0.5
    assert rows["PairWise Avg."] == 0.75
    assert rows["Rank2"] == 1.0 and rows["Rank3"] == round(1 / 3, 5) and rows["Rank4"] == 0.25
    assert rows["Rank Avg."] == round((1 / 3 + 1.0 + 0.5) / 4, 5)
    assert rows["4k"] == 1.0 and rows["8k"] == 0.5 and rows["16k"] is None and rows["128k"] == 1.0
    assert rows["AVG."] == round((3 + 1 / 3 + 1 + 0.5 + 0) / 8, 5)


def test_results_csv_layout(tmp_path):
    path = tmp_path / "results.csv"
    metrics.write_results_csv(metrics.results_rows(HAND_BUILT), path)
    lines = path.read_text().splitlines()
    assert lines[0] == ",Task,Value"
    assert lines[1] == "0,LongQA,0.66667"
    assert lines[-1].startswith("20,AVG.,")
    assert lines[3] == "2,Safety," and lines[17] == "16,16k,"  # groups without samples: empty
    with open(path) as handle:
        assert len(list(csv.reader(handle))) == 22


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_auc_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 200)
    scores = np.round(rng.normal(size=200) + labels, 1)  # rounding creates ties
    assert metrics.roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_roc_auc_is_the_exact_tie_half_fraction():
    # The definition: P(random positive > random negative) + 1/2 P(tie), as the exact fraction's nearest float,
    # so a halfway value rounds to 5 decimals the same way whatever order a library sums in.
    rng = np.random.default_rng(4)
    for _ in range(50):
        labels = rng.integers(0, 2, 41)
        labels[:2] = [0, 1]
        scores = rng.integers(-2, 3, 41).astype(float)
        pos, neg = scores[labels == 1], scores[labels == 0]
        doubled_wins = int(2 * (pos[:, None] > neg[None, :]).sum() + (pos[:, None] == neg[None, :]).sum())
        assert metrics.roc_auc(scores, labels) == doubled_wins / (2 * pos.size * neg.size)
    assert np.isnan(metrics.roc_auc([1.0, 2.0], [1, 1]))


def test_pair_auc_matches_sklearn_both_orientations():
    rng = np.random.default_rng(3)
    chosen, rejected = rng.normal(size=50) + 0.5, rng.normal(size=50)
    diffs = chosen - rejected
    expected = roc_auc_score(np.r_[np.ones(50), np.zeros(50)], np.r_[diffs, -diffs])
    assert metrics.pair_auc(diffs) == pytest.approx(expected, abs=1e-12)
    assert metrics.pair_auc(np.zeros(4)) == 0.5  # all ties
    assert metrics.pair_auc(np.ones(4)) == 1.0
    assert np.isnan(metrics.pair_auc([]))


def test_auc_report_groups_and_best_of_n_pairs():
    preds = [
        _pred("LongQA", "PairWise", "same", "4k", 1.0, answer_scores=[2.0, 1.0]),
        _pred("LongQA", "PairWise", "same", "4k", 0.0, answer_scores=[0.0, 1.0]),
        _pred("Code", "BestOfN", "3", "4k", 1.0, answer_scores=[3.0, 2.0, 1.0]),
        _pred("Code", "PairWise", "same", "4k", 1.0),  # no scores: skipped
    ]
    report = metrics.auc_report(preds)
    diffs = [1.0, -1.0, 1.0, 2.0, 1.0]
    expected = roc_auc_score(np.r_[np.ones(5), np.zeros(5)], np.r_[diffs, np.negative(diffs)])
    assert report["overall"] == round(expected, 5)
    assert report["BestOfN"] == 1.0
    assert report["Safety"] is None
    # Long-form: chosen (answer 0) vs each rejected; rejected answers are tied in gold and form no pair.
    long_form = _pred("Writing", "BestOfN", "3", "2K", 1.0, answer_scores=[2.0, 1.0, 3.0],
                      shown_order=[2, 0, 1], gold_ranks=[1, 0, 1])
    assert metrics.preference_differences([2.0, 1.0, 3.0], metrics.answer_gold_ranks(long_form)) == [1.0, -1.0]
    assert metrics.auc_report([long_form], ["Writing"])["Writing"] == 0.5


def test_agreement_report():
    both_agree = dict(tasktype="PairWise", orders=[
        {"shown_order": [0, 1], "ranks": [0, 1], "score": 1.0},
        {"shown_order": [1, 0], "ranks": [1, 0], "score": 1.0}])
    position_biased = dict(tasktype="PairWise", orders=[  # always says A
        {"shown_order": [0, 1], "ranks": [0, 1], "score": 1.0},
        {"shown_order": [1, 0], "ranks": [0, 1], "score": 0.0}])
    no_verdict = dict(tasktype="BestOfN", orders=[
        {"shown_order": [0, 1, 2], "ranks": [], "score": 0.0},
        {"shown_order": [1, 2, 0], "ranks": [2, 0, 1], "score": 1.0},
        {"shown_order": [2, 0, 1], "ranks": [1, 2, 0], "score": 1.0}])
    report = metrics.agreement_report([both_agree, position_biased, no_verdict])
    assert report["samples"] == 3
    assert report["agreement"] == round(1 / 3, 5)
    assert report["top1_agreement"] == round(1 / 3, 5)
    assert report["mean_accuracy_all_orders"] == round((1.0 + 0.5 + 2 / 3) / 3, 5)
    assert report["accuracy_default_order"] == round(2 / 3, 5)
    assert report["agreement_PairWise"] == 0.5 and report["agreement_BestOfN"] == 0.0
    assert metrics.preferred_answer_order([2, 0, 1], [1, 2, 0]) == (1, 2, 0)


def test_plots_write_files(tmp_path):
    table = metrics.accuracy_by_length(HAND_BUILT)
    assert table["All"]["32k"] == 0.25
    plots.plot_accuracy_by_length(table, tmp_path / "acc.png")
    assert (tmp_path / "acc.png").stat().st_size > 1000
    rng = np.random.default_rng(0)
    records = [dict(needle_position=float(p), length=b, correct=bool(c))
               for p, b, c in zip(rng.random(40), ["1K", "8K", "2K", "4K"] * 10, rng.integers(0, 2, 40))]
    table = plots.plot_needle_heatmap(records, tmp_path / "needle.png")
    assert table["length_buckets"] == ["1K", "2K", "4K", "8K"]
    assert np.sum(table["counts"]) == 40
    assert (tmp_path / "needle.png").stat().st_size > 1000


def test_accuracy_plot_shows_n_chance_and_unparsable_verdicts():
    """A flat 0.0 made of judgements without a verdict must not look measured: each tick and legend entry carries
    its sample count, a dashed line marks chance, and buckets with unparsable verdicts get a red cross and count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    predictions = [_pred("LongQA", "PairWise", "same", "4k", 1.0, verdict="A"),
                   _pred("LongQA", "PairWise", "diff", "4k", 0.0, verdict="B"),
                   _pred("Code", "PairWise", "diff", "8k", 0.0, verdict=None),
                   _pred("Code", "PairWise", "diff", "8k", 0.0, verdict=None),
                   _pred("Code", "PairWise", "diff", "8k", 0.0, verdict="A")]
    counts = metrics.counts_by_length(predictions)
    assert counts["All"] == {"4k": {"n": 2, "unparsable": 0}, "8k": {"n": 3, "unparsable": 2}}
    fig, ax = plt.subplots()
    plots.draw_accuracy_by_length(ax, metrics.accuracy_by_length(predictions), counts)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4k\nn=2", "8k\nn=3"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "Code (n=3, 2 unparsable)" in legend and "LongQA (n=2)" in legend and "All (n=5, 2 unparsable)" in legend
    assert "chance (pairwise)" in legend
    assert any(list(line.get_ydata()) == [0.5, 0.5] for line in ax.get_lines())
    assert [t.get_text() for t in ax.texts] == ["2/3 unparsable"]
    plt.close(fig)


def test_position_intervals_equal_count():
    intervals = plots.position_intervals([0.9, 0.1, 0.5, 0.5, 0.3, 0.7, 0.2, 0.8, 0.0, 1.0])
    assert np.bincount(intervals).tolist() == [2, 2, 2, 2, 2]
    assert intervals[8] == 0 and intervals[9] == 4


def test_results_csv_bytes_equal_pandas(tmp_path):
    """results.csv keeps pandas' index column because upstream's has it: LCM-Lab/Long-RM
    evaluate/evaluating/longreward_bench/evaluator.py save_csv calls DataFrame.to_csv(path), index=True by default
    (docs/upstream.md; issue 42 item 7 asked for none unless upstream's format has one)."""
    import pandas as pd  # installed with datasets
    rows = metrics.results_rows(HAND_BUILT)
    metrics.write_results_csv(rows, tmp_path / "ours.csv")
    # Upstream writes DataFrame(dict(Task=..., Value=...)).to_csv(path).
    pd.DataFrame(dict(Task=[r[0] for r in rows], Value=[r[1] for r in rows])).to_csv(tmp_path / "upstream.csv")
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "upstream.csv").read_bytes()


def test_empty_groups_are_none_and_never_averaged_in():
    only_pairwise = [_pred("LongQA", "PairWise", "same", "4k", 1.0), _pred("LongQA", "PairWise", "same", "4k", 0.0)]
    rows = dict(metrics.results_rows(only_pairwise, ["LongQA"]))
    assert rows["Diff."] is None and rows["Rank4"] is None and rows["Rank Avg."] is None and rows["8k"] is None
    assert rows["Same."] == rows["PairWise Avg."] == rows["AVG."] == 0.5


def test_verdict_report_counts_every_judged_order():
    grm = [dict(verdict=None), dict(verdict="A>B", orders=[dict(verdict="A>B"), dict(verdict=None)])]
    assert metrics.verdict_report(grm) == {"unparsable": 2, "judgements": 3, "share": 0.66667}
    assert metrics.verdict_report([dict(scores=[1.0, 0.0])]) is None  # DisRM: no verdicts


def test_accuracy_by_length_over_both_orders():
    """With --both-orders each sample counts with its mean over its orders (both_orders_accuracy's rule)."""
    first = dict(_pred("LongQA", "PairWise", "same", "4k", 1.0), orders=[{"score": 1.0}, {"score": 0.0}])
    second = dict(_pred("Code", "PairWise", "same", "4k", 1.0), orders=[{"score": 1.0}, {"score": 1.0}])
    assert metrics.accuracy_by_length([first, second])["All"] == {"4k": 1.0}  # the seeded order
    both = metrics.accuracy_by_length([first, second], both_orders=True)
    assert both == {"LongQA": {"4k": 0.5}, "Code": {"4k": 1.0}, "All": {"4k": 0.75}}
    assert metrics.agreement_report([dict(first, orders=[dict(o, shown_order=[0, 1], ranks=[0, 1])
                                                         for o in first["orders"]]),
                                     dict(second, orders=[dict(o, shown_order=[0, 1], ranks=[0, 1])
                                                          for o in second["orders"]])])[
        "mean_accuracy_all_orders"] == 0.75


def test_overlapping_tasks_stay_visible():
    """Every task at 1.0 (a good DisRM): each task line gets its own marker and a sideways offset, drawn above
    "All", so none hides behind another (issue 42 item 7)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = {name: {"4k": 1.0, "8k": 1.0} for name in ("All", "Code", "LongQA", "Math")}
    fig, ax = plt.subplots()
    plots.draw_accuracy_by_length(ax, table)
    lines = {line.get_label(): line for line in ax.get_lines()}
    tasks = [lines[name] for name in ("Code", "LongQA", "Math")]
    starts = [float(line.get_xdata()[0]) for line in tasks]
    assert len(set(starts)) == 3 and max(map(abs, starts)) <= plots.MAX_TASK_SPREAD / 2 + 1e-9
    assert float(lines["All"].get_xdata()[0]) == 0.0
    assert len({line.get_marker() for line in tasks}) == 3
    assert min(line.get_zorder() for line in tasks) > lines["All"].get_zorder()
    plt.close(fig)
    assert plots.task_offset(0, 1) == 0.0 and plots.task_offset(0, 40) == -plots.MAX_TASK_SPREAD / 2


def test_the_plot_shows_the_both_orders_figure(tmp_path, monkeypatch):
    """write_outputs plots accuracy_by_length_both_orders when the samples were judged in both orders, and says
    so on the axis; the seeded order's otherwise."""
    from longrm_jax.evaluation import outputs

    drawn = []
    monkeypatch.setattr(plots, "plot_accuracy_by_length", lambda table, path, **kw: drawn.append((table, kw)))
    pred = dict(_pred("Code", "PairWise", "same", "4k", 1.0), shown_order=[0, 1], gold_ranks=[0, 1],
                answer_scores=[1.0, 0.0], scores=[1.0, 0.0], truncated=False, benchmark="long-rewardbench", index=0, source=None)
    pred["orders"] = [{"shown_order": [0, 1], "ranks": [0, 1], "score": 1.0},
                      {"shown_order": [1, 0], "ranks": [0, 1], "score": 0.0}]
    for predictions, figure, value in (([pred], "both_orders_accuracy", 0.5),
                                       ([{k: v for k, v in pred.items() if k != "orders"}], "accuracy (seeded order)",
                                        1.0)):
        summary = outputs.summarize(predictions, ["Code"])
        outputs.write_outputs(str(tmp_path), predictions, summary, {"model_path": "m"})
        table, kw = drawn.pop()
        assert kw["figure"] == figure and table["All"] == {"4k": value}
    assert json.loads((tmp_path / "results.json").read_text())["both_orders_accuracy"] is None  # one order only
