"""Learning curves of training runs: held-out accuracy against step, one panel per stage, one line per run.

    python scripts/plot_learning_curves.py --out docs/img/tiny_recipe_curves.png runs/tiny_lm_seed* runs/tiny_grm_sft_seed*

Each RUN is a training output directory (its ``metrics.jsonl`` and ``config.yaml``); runs whose directory names
differ only in a trailing seed (``tiny_lm_seed3``, ``tiny_lm_seed4``) share a panel. A run's held-out pairwise
accuracy (``eval/accuracy``; a judge's ``eval/judgement_logprob_accuracy``) is drawn as a solid line, a judge's
held-out verdicts over both orders (``judge/verdict_accuracy``) as a dashed one; runs are labelled by their seed.
Points exist where the run evaluated: ``eval_every`` (and ``judge.every``) set how dense the curve is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict

import yaml

HELD_OUT = ("accuracy", "judgement_logprob_accuracy")


def read_curves(run: str) -> tuple[str, int, dict[str, list[tuple[int, float]]]]:
    """(stage, seed, {"held-out" | "verdicts": [(step, accuracy), ...]}) of one run directory."""
    with open(os.path.join(run, "config.yaml"), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row.get("split") == "eval":
                value = next((row[k] for k in HELD_OUT if k in row), None)
                if value is not None:
                    curves["held-out"].append((row["step"], value))
            elif row.get("split") == "judge" and "verdict_accuracy" in row:
                curves["verdicts"].append((row["step"], row["verdict_accuracy"]))
    for points in curves.values():  # a resumed run may log a step twice: the last value stands
        points[:] = sorted(dict(points).items())
    return config["stage"], config.get("seed", 0), curves


def plot(runs: list[str], out: str, title: str | None = None) -> str:
    import matplotlib  # noqa: PLC0415 - heavy: loaded when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    panels: dict[str, list[tuple[str, int, dict]]] = defaultdict(list)
    for run in runs:
        stage, seed, curves = read_curves(run)
        name = re.sub(r"[_-]?(seed)?\d+$", "", os.path.basename(os.path.normpath(run)))
        panels[f"{name} ({stage})"].append((run, seed, curves))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for i, (run, seed, curves) in enumerate(sorted(panels[panel], key=lambda r: (r[1], r[0]))):
            color = f"C{i % 10}"
            for name, style in (("held-out", "-"), ("verdicts", "--")):
                if curves.get(name):
                    steps, values = zip(*curves[name])
                    ax.plot(steps, [100 * v for v in values], style, color=color, marker=".",
                            label=f"seed {seed}" + (" verdicts" if name == "verdicts" else ""))
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out accuracy (%)")
        ax.set_ylim(0, 102)
        ax.axhline(50, color="grey", lw=0.5)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="training output directories")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--title", default=None, help="a title over the panels")
    args = parser.parse_args(argv)
    missing = [r for r in args.runs if not os.path.isfile(os.path.join(r, "metrics.jsonl"))]
    if missing:
        parser.error(f"no metrics.jsonl in {', '.join(missing)}")
    print(plot(args.runs, args.out, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
