r"""Long-form RewardBench by its own protocol: responses judged one at a time, binary and best-of-N accuracy.

The Long-form RewardBench code (HuihuiChyan/Long-formRMB, ``evaluation/infer_bon_vllm.py`` and
``cal_accuracy_from_file.py``; docs/upstream.md "Long-form RewardBench") scores each (prompt, response) on its
own and compares the scores. Generative RMs run under one of three protocols (``--longform-protocol``):

* ``upstream`` (default): the benchmark's protocol exactly. The judge prompt is raw text, no chat template:
  the repository's prompt for the model directory's name (``UPSTREAM_PROMPTS``; any other name gets its
  ``Default`` prompt), tokenized as vLLM does (the tokenizer's own special tokens, e.g. Llama 3's BOS). Greedy,
  1,024 new tokens unless ``--max-new-tokens`` says otherwise. The score is the *first* match of
  ``\*\*Result:\*\* ([1-9]\.[0-9]*)`` in the stripped output (``8``, ``10.0``, ``0.5`` and a double space do
  not parse). A sample is right only when every score parsed and the chosen one is strictly above every
  rejected one; a pair with an unparsed score is left out of binary accuracy.
* ``pointwise`` (ours): our judge prompt (``POINTWISE_SYSTEM_PROMPT``, written here) through the model's chat
  template, a lenient parser (the *last* ``**Result:** x`` of any number form), and an unparsed score loses
  every comparison (a chosen beats an unparsed rejected; the pair counts in binary accuracy).
* ``joint``: the Long-RewardBench style ranking of all answers in one prompt (``evaluation.runner``).

Discriminative RMs score each templated (prompt, response) with the head, as for Long-RewardBench.

Metrics per subset and overall (rows of ``results.csv``):

* ``{subset}``: best-of-N accuracy (best-of-4: 1 chosen vs 3 rejected; Reasoning is 1 vs 1): the chosen score is
  strictly above every rejected one (ties wrong).
* ``{subset} Binary``: per-pair binary accuracy, pooled over every (chosen, rejected) pair of the subset: the chosen
  score strictly above that rejected one (``upstream``: over the pairs whose two scores parsed).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from longrm_jax.evaluation.encoding import maybe_truncate
from longrm_jax.evaluation.grm.generator import make_generator, simulated_budgets
from longrm_jax.evaluation.timings import Timings
from longrm_jax.evaluation.judging import base_prediction
from longrm_jax.evaluation.samples import LONG_FORM, EvalSample

PROTOCOLS = ("upstream", "pointwise", "joint")
UPSTREAM_MAX_NEW_TOKENS = 1024  # infer_bon_vllm.py --max_tokens default

# The benchmark's judge prompts by model directory name, verbatim (a judge is sensitive to every word); a model
# of any other name gets "Default". Python str.format fields {prompt} and {response}. Note the prompts ask for a
# 0-100 or 1-5 rating while the parser wants "**Result:** x.y": a model that follows them does not parse.
UPSTREAM_PROMPTS = {
    "Default": (
        "### Task Description\nPlease act as an impartial judge and evaluate the quality of the response provided "
        "by an AI assistant to the user query displayed below.\n\nNotes:\n1- Your evaluation should consider "
        "factors such as the helpfulness, relevance, accuracy, depth, creativity, and level of detail of the "
        "response.\n2- Begin your evaluation by providing a short explanation.\n3- Be as objective as possible. "
        "After providing your explanation, please rate the response on a scale of 0 to 100. For your rating, only "
        "give a number between 0 and 100 (inclusive), do not use any markdown, and do not put any text after your "
        "final rating.\n\n[Query]\n{prompt}\n\n[Response]\n{response}\n\n[Your judgement]"),
    "Selene-1-Mini-Llama-3.1-8B": (
        "You are tasked with evaluating a response based on a given instruction (which may contain an Input) and a "
        "scoring rubric and reference answer that serve as the evaluation standard. Provide a comprehensive "
        "feedback on the response quality strictly adhering to the scoring rubric, without any general evaluation. "
        "Follow this with a score between 1 and 5, referring to the scoring rubric. Avoid generating any additional "
        "opening, closing, or explanations.\nHere are some rules of the evaluation:\n(1) You should prioritize "
        "evaluating whether the response satisfies the provided rubric. The basis of your score should depend "
        "exactly on the rubric. However, the response does not need to explicitly address points raised in the "
        "rubric.\nRather, evaluate the response based on the criteria outlined in the rubric.\n(2) You should "
        "refer to the provided reference answer as a guide for evaluating the response.\nYour reply should "
        "strictly follow this format:\n**Reasoning:** <Your feedback>\n**Result:** <an integer between 1 and "
        "5>\nHere is the data:\nInstruction:\n{prompt}\n\nResponse:\n{response}\n\nPlease provide your "
        "evaluation:"),
    "Skywork-Critic-Llama-3.1-8B": (
        "Please act as an impartial judge and evaluate the quality of the response provided by an AI assistant to "
        "the user query displayed below.\n\nNotes:\n1- Your evaluation should consider factors such as the "
        "helpfulness, relevance, accuracy, depth, creativity, and level of detail of the response.\n2- Begin your "
        "evaluation by providing a short explanation.\n3- Be as objective as possible. After providing your "
        "explanation, please rate the response on a scale of 0 to 100. For your rating, only give a number between "
        "0 and 100 (inclusive), do not use any markdown, and do not put any text after your final rating.\n\n"
        "[User Question]\n{prompt}\n\n[The Start of Assistant's Answer]\n{response}\n[The End of Assistant's "
        "Answer]"),
}

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
_UPSTREAM_RESULT_RE = re.compile(r"\*\*Result:\*\* ([1-9]\.[0-9]*)")


def upstream_prompt(model_path: str, prompt: str, response: str) -> str:
    """The benchmark's raw-text judge prompt: chosen by the model path's last component, as its script does."""
    template = UPSTREAM_PROMPTS.get(model_path.split("/")[-1], UPSTREAM_PROMPTS["Default"])
    return template.format(prompt=prompt, response=response)


def pointwise_messages(prompt: str, response: str) -> list[dict]:
    """Chat messages [system, user] asking a GRM to score one ``response`` to ``prompt`` (protocol pointwise)."""
    user = (f"[User Request]\n{prompt}\n\n[The Start of the Assistant's Response]\n{response}\n"
            "[The End of the Assistant's Response]\n\nEvaluate the response and end with the line "
            "\"**Result:** x.y\".")
    return [{"role": "system", "content": POINTWISE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_result(text: str, protocol: str = "pointwise") -> float | None:
    """A judgement's score; None when there is none. ``upstream``: the first strict ``**Result:** x.y`` of the
    stripped text; ``pointwise``: the last ``**Result:** x`` of any number form."""
    if protocol == "upstream":
        match = _UPSTREAM_RESULT_RE.search(text.strip())
        return float(match.group(1)) if match else None
    found = _RESULT_RE.findall(text)
    return float(found[-1]) if found else None


def pair_outcomes(scores: Sequence[float | None], chosen: Sequence[bool], protocol: str = "pointwise"
                  ) -> list[bool]:
    """For every (chosen, rejected) pair: the chosen score strictly above the rejected one. An unparsed (None)
    score loses (``pointwise``) or leaves its pairs out (``upstream``)."""
    good = [s for s, c in zip(scores, chosen) if c]
    bad = [s for s, c in zip(scores, chosen) if not c]
    if protocol == "upstream":
        return [c > r for c in good for r in bad if c is not None and r is not None]
    return [c is not None and (r is None or c > r) for c in good for r in bad]


def protocol_of(prediction: dict) -> str:
    """The protocol a Long-form prediction was judged under: upstream / pointwise (GRM, each response alone),
    joint (GRM, one ranking) or disrm (head scores)."""
    if "protocol" in prediction:
        return prediction["protocol"]
    return "disrm" if "scores" in prediction else "joint"


def _chosen_flags(prediction: dict) -> list[bool]:
    """Chosen flags in the stored (gold) order of ``scores``: the first answers, as many as gold rank 0 has."""
    num_chosen = sum(rank == 0 for rank in prediction["gold_ranks"])  # gold_ranks is in shown order
    return [i < num_chosen for i in range(len(prediction["gold_ranks"]))]


def binary_outcomes(prediction: dict) -> list[bool]:
    """Pair outcomes of a Long-form prediction holding per-answer ``scores`` in gold order (both RM kinds)."""
    return pair_outcomes(prediction["scores"], _chosen_flags(prediction), prediction.get("protocol", "pointwise"))


def best_of_n_correct(scores: Sequence[float | None], chosen: Sequence[bool], protocol: str = "pointwise") -> bool:
    """Every chosen strictly above every rejected; ``upstream`` also needs every score parsed."""
    if protocol == "upstream" and any(s is None for s in scores):
        return False
    return all(pair_outcomes(scores, chosen, protocol)) and any(chosen) and not all(chosen)


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


def pointwise_prompt_ids(sample: EvalSample, tokenizer, answer: int, max_length: int | None,
                         protocol: str = "pointwise", model_path: str = ""):
    """(ids, truncated) of the judge prompt for answer ``answer`` (gold order) of a Long-form sample:
    ``upstream``: the raw-text prompt with the tokenizer's own special tokens (as vLLM encodes a string prompt);
    ``pointwise``: our messages through the chat template."""
    if protocol == "upstream":
        text = upstream_prompt(model_path, sample.prompt or "", sample.answers[answer])
        ids = tokenizer.hf(text, add_special_tokens=True)["input_ids"]
    else:
        ids = tokenizer.encode(tokenizer.render(pointwise_messages(sample.prompt or "", sample.answers[answer]),
                                                add_generation_prompt=True))
    return maybe_truncate(np.asarray(ids, dtype=np.int32), max_length)


def pointwise_prediction(sample: EvalSample, outputs: Sequence[str], num_tokens: Sequence[int],
                         truncated: Sequence[bool], protocol: str = "pointwise") -> dict:
    """Prediction of a GRM that judged each answer of ``sample`` (gold order) on its own; ``protocol`` (upstream
    or pointwise) picks the parser and the handling of unparsed scores, and is recorded."""
    record = base_prediction(sample)
    scores = [parse_result(text, protocol) for text in outputs]
    chosen = [i < sample.num_chosen for i in range(len(sample.answers))]
    correct = best_of_n_correct(scores, chosen, protocol)
    record.update(protocol=protocol, outputs=list(outputs), scores=scores, correct=correct,
                  score=float(correct), num_unparsable=sum(s is None for s in scores),
                  # AUC input: an unparsable response ranks below every parsed one
                  answer_scores=[-1e9 if s is None else float(s) for s in scores],
                  num_tokens=list(num_tokens), truncated=bool(any(truncated)))
    return record


def run_pointwise_grm(cfg, samples: list[EvalSample], model, tokenizer, mesh) -> tuple[list[dict], Timings]:
    """(predictions, the generator's timings): judge every answer of every Long-form sample on its own, greedy,
    under ``cfg.longform_protocol`` (upstream: ``cfg.max_new_tokens`` or 1,024 new tokens; pointwise:
    ``cfg.judgement_budget``)."""
    protocol = cfg.longform_protocol
    if protocol not in ("upstream", "pointwise"):
        raise ValueError(f"judging each response alone needs protocol upstream or pointwise, not {protocol!r}")
    if any(s.benchmark != LONG_FORM for s in samples):
        raise ValueError("the pointwise protocols are for Long-form RewardBench records")
    if protocol == "upstream":
        cfg = dataclasses.replace(cfg, max_new_tokens=cfg.max_new_tokens or UPSTREAM_MAX_NEW_TOKENS)
    prompts, owners, cuts = [], [], []
    for s_index, sample in enumerate(samples):
        for answer in range(len(sample.answers)):
            ids, cut = pointwise_prompt_ids(sample, tokenizer, answer, cfg.max_length, protocol, cfg.model_path)
            prompts.append(ids)
            owners.append(s_index)
            cuts.append(cut)
    generator = make_generator(cfg, model, tokenizer, mesh)
    generations = generator.generate(prompts, progress=cfg.progress, budgets=simulated_budgets(cfg, prompts))
    texts = [tokenizer.hf.decode(g.tokens.tolist(), skip_special_tokens=True) for g in generations]
    predictions = []
    for s_index, sample in enumerate(samples):
        members = [i for i, owner in enumerate(owners) if owner == s_index]
        predictions.append(pointwise_prediction(sample, [texts[i] for i in members],
                                                [len(prompts[i]) for i in members], [cuts[i] for i in members],
                                                protocol))
    return predictions, Timings(generator.timings)
