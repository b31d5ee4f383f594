"""What an evaluation run writes and prints from its predictions: the summary (upstream's result rows, AUC,
agreement over orders, per-length accuracy, the long-form needle table), upstream's per-task ``{Task}.jsonl``,
``predictions.jsonl``, ``results.csv`` / ``results.json`` and the plots (the list of files: evaluation.runner)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

from longrm_jax.data.readers import NEEDLE_POSITION_FIELDS
from longrm_jax.evaluation import longform, metrics, plots
from longrm_jax.evaluation.samples import LONG_FORM, NEEDLE_LENGTH_FIELDS

logger = logging.getLogger(__name__)


def summarize(predictions: list[dict], tasks: Sequence[str]) -> dict:
    """results rows (upstream layout and/or long-form), AUC, agreement, per-length accuracy, needle table."""
    bench = [p for p in predictions if p["benchmark"] != LONG_FORM]
    long_form = [p for p in predictions if p["benchmark"] == LONG_FORM]
    rows: list[tuple[str, float]] = []
    summary: dict = {}
    if bench:
        bench_tasks = list(tasks) or list(dict.fromkeys(p["task"] for p in bench))
        rows += metrics.results_rows(bench, bench_tasks)
        summary["auc"] = metrics.auc_report(bench, bench_tasks)
    if long_form:
        subsets = list(dict.fromkeys(p["task"] for p in long_form))
        lf_rows = longform.summary_rows(long_form)  # best-of-N and per-pair binary accuracy
        rows += [(f"LongForm/{label}" if bench else label, value) for label, value in lf_rows]
        summary["long_form_auc"] = metrics.auc_report(long_form, subsets)
        # which protocol produced the scores (evaluation.longform): the results are comparable only within one
        summary["long_form_protocol"] = ", ".join(sorted({longform.protocol_of(p) for p in long_form}))
        note = needle_heatmap_note(long_form)
        if note:
            logger.warning("needle heatmap: %s", note)
            summary["needle_heatmap_note"] = note
    summary["results"] = dict(rows)
    summary["results_rows"] = rows
    summary["both_orders"] = agreement = metrics.agreement_report(predictions)
    # The headline figures under the names the console prints (both_orders.* keeps the older keys).
    summary["both_orders_accuracy"] = agreement["mean_accuracy_all_orders"]
    summary["both_orders_agreement"] = agreement["agreement"]
    summary["accuracy_by_length"] = metrics.accuracy_by_length(predictions)
    if agreement["samples"]:  # what accuracy_by_length.png plots then
        summary["accuracy_by_length_both_orders"] = metrics.accuracy_by_length(predictions, both_orders=True)
    summary["counts_by_length"] = metrics.counts_by_length(predictions)
    summary["num_samples"] = len(predictions)
    summary["num_truncated"] = int(sum(p.get("truncated", False) for p in predictions))
    by_task: dict[str, list[int]] = {}
    for p in predictions:
        counts = by_task.setdefault(p["task"], [0, 0])
        counts[0] += bool(p.get("truncated", False))
        counts[1] += 1
    summary["truncated_by_task"] = by_task
    verdicts = metrics.verdict_report(predictions)
    if verdicts is not None:
        summary["unparsable_verdicts"] = verdicts
        if verdicts["unparsable"] and verdicts["share"] > metrics.UNPARSABLE_WARN_SHARE:
            logger.warning("%s", unparsable_warning(verdicts))
    return summary


def needle_heatmap_note(long_form: list[dict]) -> str | None:
    """Why the needle heatmap is not drawn, or drawn from part of the records (None: drawn from all)."""
    placed = [p for p in long_form if p.get("needle_position") is not None]
    if not placed:
        return (f"not drawn: no Long-form record carries a needle position (field "
                f"{', '.join(NEEDLE_POSITION_FIELDS)}, a number in [0, 1])")
    notes = []
    if len(placed) < len(long_form):
        notes.append(f"{len(long_form) - len(placed)} of {len(long_form)} Long-form records carry no needle "
                     "position and are left out of it")
    if all(p["length"] == "all" for p in placed):
        notes.append(f"no record carries a response length (field length_bucket, "
                     f"{', '.join(NEEDLE_LENGTH_FIELDS)}): one row 'all'")
    return "; ".join(notes) or None


def unparsable_warning(verdicts: dict) -> str:
    return (f"{verdicts['unparsable']} of {verdicts['judgements']} judgements ({100 * verdicts['share']:.1f}%) "
            "held no parsable verdict: each scores 0 and ties in the AUC, so these results do not measure the "
            "judge. Is the model a trained generative judge, and is --max-new-tokens large enough? See the "
            "'output' field of predictions.jsonl")


def upstream_record(prediction: dict) -> dict:
    """A line of upstream's per-task ``{Task}.jsonl`` (what its ``evaluate()`` re-reads): ``output`` is the
    judge's text (GRM) or the scores in shown order (DisRM), ``shuffled_order`` the shown permutation."""
    if "scores" in prediction:
        output = [prediction["scores"][i] for i in prediction["shown_order"]]
    else:
        output = prediction["output"]
    return {"index": prediction["index"], "shuffled_order": prediction["shown_order"], "subset": prediction["task"],
            "task": prediction["source"], "ctx_length": prediction["length"], "tasktype": prediction["tasktype"],
            "subtype": prediction["subtype"], "output": output}


def write_outputs(save_path: str, predictions: list[dict], summary: dict, settings: dict) -> None:
    os.makedirs(save_path, exist_ok=True)
    by_task: dict[str, list[dict]] = {}
    for record in predictions:
        if record["benchmark"] != LONG_FORM:
            by_task.setdefault(record["task"], []).append(upstream_record(record))
    for task, records in by_task.items():
        with open(os.path.join(save_path, f"{task}.jsonl"), "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    with open(os.path.join(save_path, "predictions.jsonl"), "w", encoding="utf-8") as handle:
        for record in predictions:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    metrics.write_results_csv(summary["results_rows"], os.path.join(save_path, "results.csv"))
    both = summary.get("accuracy_by_length_both_orders")
    plots.plot_accuracy_by_length(both or summary["accuracy_by_length"],
                                  os.path.join(save_path, "accuracy_by_length.png"),
                                  title=os.path.basename(os.path.normpath(settings["model_path"])),
                                  counts=summary["counts_by_length"],
                                  figure="both_orders_accuracy" if both else "accuracy (seeded order)")
    needles = [dict(p, length=p["length"]) for p in predictions if p.get("needle_position") is not None]
    if needles:
        summary["needle_heatmap"] = plots.plot_needle_heatmap(needles, os.path.join(save_path, "needle_heatmap.png"))
    payload = {k: v for k, v in summary.items() if k != "results_rows"}
    payload["settings"] = settings
    with open(os.path.join(save_path, "results.json"), "w") as handle:
        json.dump(payload, handle, indent=2, ensure_ascii=False)


def format_summary(summary: dict) -> str:
    """The console table: results rows (a group without samples prints empty), AUC and, for a generative
    judge, how many judgements held no parsable verdict. A headline figure's label is its results.json key
    (``both_orders_accuracy``, ``both_orders_agreement``, ``unparsable_verdicts``; the rows as in ``results``)."""
    agreement = summary.get("both_orders") or {}
    labels = list(summary["results"]) + ["AUC", "unparsable_verdicts", "Long-form protocol", "needle heatmap"]
    labels += ["both_orders_agreement", "both_orders_accuracy"] if agreement.get("samples") else []
    width = max(len(label) for label in labels)
    lines = [f"{label:<{width}}  {'' if value is None else f'{value:.5f}'}".rstrip()
             for label, value in summary["results"].items()]
    if summary.get("auc"):
        lines.append(f"{'AUC':<{width}}  {summary['auc'].get('overall')}")
    if agreement.get("samples"):
        # AVG. above is the seeded order's (upstream's figure); this one averages each sample over its orders
        lines.append(f"{'both_orders_accuracy':<{width}}  {agreement['mean_accuracy_all_orders']:.5f} (each "
                     f"sample's mean over its orders; AVG. is the seeded order's {agreement['accuracy_default_order']:.5f})")
        lines.append(f"{'both_orders_agreement':<{width}}  {agreement['agreement']:.5f} of {agreement['samples']} "
                     f"samples (same best answer: {agreement['top1_agreement']:.5f})")
    if summary.get("long_form_protocol"):
        lines.append(f"{'Long-form protocol':<{width}}  {summary['long_form_protocol']}")
    if summary.get("needle_heatmap_note"):
        lines.append(f"{'needle heatmap':<{width}}  {summary['needle_heatmap_note']}")
    verdicts = summary.get("unparsable_verdicts")
    if verdicts:
        lines.append(f"{'unparsable_verdicts':<{width}}  {verdicts['unparsable']} of {verdicts['judgements']} "
                     f"({100 * verdicts['share']:.1f}%)")
    return "\n".join(lines)



def truncation_line(summary: dict, max_length: int | None) -> str | None:
    """One console line when --max-length cut any sample: how many of each task's samples (else None)."""
    by_task = summary.get("truncated_by_task") or {}
    cut = sum(k for k, _ in by_task.values())
    if not cut:
        return None
    total = sum(n for _, n in by_task.values())
    tasks = ", ".join(f"{task} {k} of {n}" for task, (k, n) in by_task.items() if k)
    return (f"truncated: {cut} of {total} samples longer than --max-length {max_length} were judged on their first "
            f"and last tokens only ({tasks}); --no-truncate or a larger --max-length judges them whole")
