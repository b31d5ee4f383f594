"""Figures written next to the results: accuracy against context length, and the long-form needle heatmap."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def _pyplot():
    import matplotlib  # heavy: loaded when a plot is drawn

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _bucket_sort_key(bucket: str) -> float:
    """'4k' -> 4000, '1K' -> 1000, '512' -> 512; unknown labels sort last, alphabetically among themselves."""
    text = str(bucket).strip().lower()
    try:
        if text.endswith("k"):
            return float(text[:-1]) * 1000
        return float(text)
    except ValueError:
        return float("inf")


# A random pairwise judgement is right half the time (Best-of-N partial credit has other chance levels).
PAIRWISE_CHANCE = 0.5


def plot_accuracy_by_length(table: Mapping[str, Mapping[str, float]], path, title: str = "",
                            counts: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None,
                            figure: str = "accuracy") -> None:
    """Line plot of accuracy per length bucket: one thin line per task, a thick black one for ``"All"``.

    ``table`` maps a task (or ``"All"``) to {length bucket: accuracy}, as from
    :func:`longrm_jax.evaluation.metrics.accuracy_by_length`; ``counts`` the same keys to {"n", "unparsable"}
    (:func:`~longrm_jax.evaluation.metrics.counts_by_length`), drawn as described in :func:`draw_accuracy_by_length`.
    ``figure``: what the values are, the y axis label and the title (e.g. ``both_orders_accuracy``, the name the
    console and results.json give it).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw_accuracy_by_length(ax, table, counts)
    ax.set_ylabel(figure)
    ax.set_title(f"{title}: {figure} by context length" if title else f"{figure} by context length")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# Tasks get a marker each and a small sideways offset: lines on the same values (every task at 1.0, a common
# sight for a good model) would otherwise hide each other and the "All" line.
TASK_MARKERS = ("o", "^", "v", "D", "P", "X", "<", ">", "*", "h")
MAX_TASK_SPREAD = 0.3  # of the distance between two buckets, over all the tasks' offsets


def task_offset(index: int, count: int) -> float:
    """Sideways offset (in bucket units) of task ``index`` of ``count``: centred on the bucket, at most
    :data:`MAX_TASK_SPREAD` from the first task to the last."""
    if count < 2:
        return 0.0
    step = min(0.06, MAX_TASK_SPREAD / (count - 1))
    return (index - (count - 1) / 2) * step


def draw_accuracy_by_length(ax, table: Mapping[str, Mapping[str, float]],
                            counts: Mapping[str, Mapping[str, Mapping[str, int]]] | None = None) -> None:
    """The accuracy-by-length lines on ``ax``, with what a reader needs to trust a point: each task with its own
    marker and a small sideways offset (:func:`task_offset`), drawn over ``All``; the pairwise chance line; the
    number of samples per bucket (under each tick) and per task (legend); and, where judgements held no
    parsable verdict (they score 0), a red cross on the overall point with their count, so that a flat 0.0 made
    of unparsable outputs is not read as a measured accuracy."""
    counts = counts or {}
    buckets = sorted({b for row in table.values() for b in row}, key=lambda b: (_bucket_sort_key(b), str(b)))
    x = np.arange(len(buckets))

    def cell(name, bucket):
        return counts.get(name, {}).get(bucket, {"n": 0, "unparsable": 0})

    def label(name):
        n = sum(c["n"] for c in counts.get(name, {}).values())
        bad = sum(c["unparsable"] for c in counts.get(name, {}).values())
        if not n:
            return name
        return f"{name} (n={n}" + (f", {bad} unparsable" if bad else "") + ")"

    if "All" in table:  # under the tasks, so that a task on the same value stays visible
        ys = [table["All"].get(b, np.nan) for b in buckets]
        ax.plot(x, ys, marker="s", linewidth=2.8, color="black", label=label("All"), zorder=2)
        flagged = [(i, y, cell("All", b)) for i, (b, y) in enumerate(zip(buckets, ys)) if cell("All", b)["unparsable"]]
        if flagged:
            ax.scatter([i for i, _, _ in flagged], [y for _, y, _ in flagged], marker="x", s=140, linewidths=2.5,
                       color="red", zorder=5, label="judgements without a parsable verdict (scored 0)")
            for i, y, c in flagged:
                ax.annotate(f"{c['unparsable']}/{c['n']} unparsable", (i, y), textcoords="offset points",
                            xytext=(0, 9), ha="center", fontsize=7, color="red")
    tasks = sorted(name for name in table if name != "All")
    for index, name in enumerate(tasks):
        ys = [table[name].get(b, np.nan) for b in buckets]
        ax.plot(x + task_offset(index, len(tasks)), ys, marker=TASK_MARKERS[index % len(TASK_MARKERS)],
                linewidth=1.2, alpha=0.85, label=label(name), zorder=3)
    ax.axhline(PAIRWISE_CHANCE, linestyle="--", linewidth=1.0, color="grey", label="chance (pairwise)")
    ticks = [f"{b}\nn={cell('All', b)['n']}" if counts else str(b) for b in buckets]
    ax.set_xticks(x, ticks)
    ax.set_xlabel("context length bucket (n: samples)" if counts else "context length bucket")
    ax.set_ylabel("accuracy")  # plot_accuracy_by_length names the figure
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)


def position_intervals(positions: Sequence[float], num_intervals: int = 5) -> np.ndarray:
    """Interval index of each needle position, as the benchmark's ``divide_result_bon2pair.py`` cuts them:
    positions sorted (ties keep their order), then runs of ``ceil(n / num_intervals)`` in turn (so fewer than
    ``num_intervals`` intervals when n is small, e.g. 3 of 2 for n = 6)."""
    positions = np.asarray(positions, dtype=np.float64)
    order = np.argsort(positions, kind="mergesort")
    per_interval = max(1, -(-len(positions) // num_intervals))
    intervals = np.empty(len(positions), dtype=np.int64)
    intervals[order] = np.arange(len(positions)) // per_interval
    return intervals


def needle_heatmap_table(
    records: Sequence[Mapping], num_intervals: int = 5
) -> tuple[list[str], list[str], np.ndarray, np.ndarray, list[list]]:
    """Accuracy per (length bucket, position interval) for records with ``needle_position``/``length``/``correct``.

    As the benchmark's code: the position intervals are cut within each length bucket (``position_intervals``),
    so interval j of two buckets may span different positions. Returns (row labels = length buckets, column
    labels 1..num_intervals, accuracy [rows, cols] (NaN where empty), counts [rows, cols], position ranges
    [rows][cols] = [first, last] position or None).
    """
    buckets = sorted({str(r["length"]) for r in records}, key=lambda b: (_bucket_sort_key(b), b))
    correct = np.zeros((len(buckets), num_intervals))
    counts = np.zeros((len(buckets), num_intervals))
    ranges: list[list] = [[None] * num_intervals for _ in buckets]
    for row, bucket in enumerate(buckets):
        members = [r for r in records if str(r["length"]) == bucket]
        positions = np.array([float(r["needle_position"]) for r in members])
        intervals = position_intervals(positions, num_intervals)
        for record, interval in zip(members, intervals):
            counts[row, interval] += 1
            correct[row, interval] += float(record["correct"])
        for interval in range(num_intervals):
            inside = positions[intervals == interval]
            if inside.size:
                ranges[row][interval] = [round(float(inside.min()), 5), round(float(inside.max()), 5)]
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(counts > 0, correct / np.maximum(counts, 1), np.nan)
    return buckets, [str(i + 1) for i in range(num_intervals)], accuracy, counts, ranges


def plot_needle_heatmap(records: Sequence[Mapping], path, num_intervals: int = 5) -> dict:
    """Heatmap of accuracy by response length bucket x needle position interval; returns the table as a dict."""
    plt = _pyplot()
    rows, columns, accuracy, counts, ranges = needle_heatmap_table(records, num_intervals)
    fig, ax = plt.subplots(figsize=(1.4 * num_intervals + 2, 0.7 * len(rows) + 2))
    image = ax.imshow(accuracy, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for i in range(len(rows)):
        for j in range(num_intervals):
            if counts[i, j]:
                low, high = ranges[i][j]
                ax.text(j, i, f"{accuracy[i, j]:.2f}\n{low:.2f}-{high:.2f}\n(n={int(counts[i, j])})", ha="center",
                        va="center", fontsize=7, color="white" if accuracy[i, j] < 0.6 else "black")
    ax.set_xticks(range(num_intervals), columns, fontsize=8)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("needle relative position: equal-count intervals within each length bucket")
    ax.set_ylabel("response length bucket")
    fig.colorbar(image, ax=ax, label="accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {
        "length_buckets": rows,
        "position_intervals": columns,
        "position_ranges": ranges,
        "accuracy": [[None if np.isnan(v) else round(float(v), 5) for v in row] for row in accuracy],
        "counts": counts.astype(int).tolist(),
    }
