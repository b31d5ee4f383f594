"""Held-out judging while a generative judge trains (``judge.data``; stages sft and simpo).

A judged step is its saved checkpoint, handled as a user would handle it: exported as ``python -m
longrm_jax.export`` exports it (LoRA merged, the run's tokenizer beside it) and judged by the evaluator with the
settings of ``python -m longrm_jax.evaluate --both-orders --limit SAMPLES --max-new-tokens N --dtype D --replicas 1``,
that command's own ``EvalConfig``. The prompts, the greedy decoding and the verdict parser are the evaluator's, so the
figures equal that command's on the exported judge. The log-prob comparison of held-out judgements
(``eval/judgement_logprob_accuracy``) cannot tell a judge that copies the document's quotes from one that decides:
the right and the wrong judgement differ in their quotes as well as in the verdict (docs/training.md).

Outputs: OUTPUT_DIR/judge/step_N/ holds the evaluator's results (results.json, predictions.jsonl, ...); the
export it judged is removed once judged.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time

from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR
from longrm_jax.evaluation.config import EvalConfig
from longrm_jax.evaluation.runner import run_evaluation
from longrm_jax.hf.save import save_pretrained
from longrm_jax.training.config_schema import TrainConfig
from longrm_jax.training.model_setup import trained_model

JUDGE_DIR = "judge"


def evaluate_config(cfg: TrainConfig, model_path: str, save_path: str) -> EvalConfig:
    """The evaluator's settings that judge ``model_path`` as training does, in this process."""
    judge = cfg.judge
    return EvalConfig(model_path=model_path, data_path=judge.data, save_path=save_path, both_orders=True,
                      limit=judge.samples, max_new_tokens=judge.max_new_tokens, dtype=judge.dtype, overwrite=True,
                      progress=False, replicas="1").validate()


def make_judge(cfg: TrainConfig):
    """``judge(checkpoint_dir, step) -> figures`` (training.step_loop.JUDGE_FIGURES) for ``cfg``'s run; a missing
    ``judge.data`` stops here, before training."""
    if not os.path.exists(cfg.judge.data):
        raise FileNotFoundError(f"judge.data: {cfg.judge.data} does not exist (a Long-RewardBench directory of "
                                "{Task}.jsonl files, or one task file); set judge.data=null to train without "
                                "held-out verdicts")

    def judge(checkpoint_dir: str, step: int) -> dict:
        started = time.perf_counter()
        out = os.path.join(cfg.output_dir, JUDGE_DIR, f"step_{step}")
        export = os.path.join(out, "export")
        shutil.rmtree(export, ignore_errors=True)
        save_pretrained(trained_model(checkpoint_dir, step), export,
                        tokenizer_dir=cfg.data.tokenizer or TINY_TOKENIZER_DIR, progress=False)
        evaluator = logging.getLogger("longrm_jax.evaluation")
        level = evaluator.level
        evaluator.setLevel(logging.ERROR)  # the figures come back as one line (training.step_loop.judge_line)
        try:
            summary = run_evaluation(evaluate_config(cfg, export, os.path.join(out, "results")))
        finally:
            evaluator.setLevel(level)
            shutil.rmtree(export, ignore_errors=True)
        verdicts = summary.get("unparsable_verdicts") or {"unparsable": 0, "judgements": 0}
        agreement = summary["both_orders_agreement"]
        return {"verdict_accuracy": summary["both_orders_accuracy"] or 0.0,
                "agreement": math.nan if agreement is None else agreement,
                "unparsable": verdicts["unparsable"], "judgements": verdicts["judgements"],
                "seconds": time.perf_counter() - started}

    return judge
