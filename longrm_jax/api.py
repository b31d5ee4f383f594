"""A small public Python API: score answers with a discriminative reward model, judge them with a generative one.

Both classes run the evaluator's own code (``python -m longrm_jax.evaluate``), not a copy of it: each input is
wrapped in the evaluator's :class:`~longrm_jax.evaluation.samples.EvalSample`, so the chat template, the middle
truncation, the position the score is read at (the sequence's last token: ``<|im_end|>`` or the newline after it,
as the template ends the turn), the judge prompt and the verdict parser are those of ``evaluate``, and the numbers
equal what it writes to ``predictions.jsonl`` for the same text (``tests/test_api.py``)::

    from longrm_jax import RewardModel, Judge

    rm = RewardModel.from_pretrained("runs/tiny_disrm_hf")
    rm.score("What is 2 + 2?", "4")                        # one float
    rm.score("What is 2 + 2?", ["4", "5", "22"])           # best-of-N: np.ndarray [3]
    rm.compare("What is 2 + 2?", "4", "5").probability     # P(a preferred over b) = sigmoid(r_a - r_b)

    judge = Judge.from_pretrained("runs/tiny_grm_hf")
    judge.judge(document, "What is the password of the blue door?", [answer_a, answer_b]).best  # 0, 1 or None

A prompt is a string (one user turn) or a list of chat messages (``[{"role": "user", "content": ...}, ...]``, as
a Long-RewardBench ``prompt_template``). ``mesh``: a :class:`jax.sharding.Mesh` or axis sizes such as
``{"fsdp": 2, "seq": 2}`` (as ``evaluate --mesh``); rows are split over ``data`` x ``fsdp`` and, with ``seq`` > 1,
tokens over ``seq`` (ring attention).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import os

import numpy as np

from longrm_jax.data.records import chat_messages_problem
from longrm_jax.evaluation.config import EvalConfig, setting_problem
from longrm_jax.evaluation.encoding import (UPSTREAM_MAX_LENGTH, ModelDirError, disrm_sequences_batch, grm_prompt_ids,
                                            load_chat_tokenizers, verdict_letter_token_ids)
from longrm_jax.evaluation.grm.generator import make_generator
from longrm_jax.evaluation.judging import grm_prediction
from longrm_jax.evaluation.metrics import BEST_OF_N, PAIRWISE, preferred_answer_order
from longrm_jax.evaluation.runner import build_mesh, load_model, resolve_dtype
from longrm_jax.evaluation.samples import EvalSample
from longrm_jax.evaluation.scoring import DisRMScorer
from longrm_jax.hf.load import read_hf_config

Prompt = str | Sequence[Mapping[str, str]]

__all__ = ["Comparison", "Judge", "Judgement", "RewardModel"]


def _is_one_prompt(prompt: Any) -> bool:
    """A string, or a list of chat messages (dicts), is one prompt; a list of those is a batch."""
    if isinstance(prompt, str):
        return True
    return isinstance(prompt, Sequence) and len(prompt) > 0 and all(isinstance(m, Mapping) for m in prompt)


def _messages(prompt: Prompt) -> list[dict]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not _is_one_prompt(prompt):
        raise TypeError(f"a prompt is a string or a list of chat messages ({{'role': ..., 'content': ...}}), got "
                        f"{type(prompt).__name__}")
    messages = [dict(m) for m in prompt]
    problem = chat_messages_problem(messages)
    if problem:
        i, key, what = problem
        raise TypeError(f"prompt message {i}: '{key}' {what}")
    return messages


def _strings(value: Any, what: str) -> list[str]:
    """``value`` as a list of strings: a list or tuple of them (a lone string is refused: it is no list)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list of strings, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(f"{what}[{i}] must be a string, got {type(item).__name__}")
    return list(value)


def _check_settings(**settings) -> None:
    """The evaluator's rule for each setting (``evaluation.config.setting_problem``: what evaluate's flags
    refuse), as a ValueError naming the argument."""
    for name, value in settings.items():
        problem = setting_problem(name, value)
        if problem:
            raise ValueError(f"{name} {problem}")


JUDGE_KINDS = ("auto", "pair", "rank")


def _sample(prompt: Prompt, answers: Sequence[str], index: int = 0, kind: str = "auto"):
    """The evaluator's sample for ``answers`` to ``prompt``, shown in the given order. ``kind``: "pair" (the
    pairwise prompt, ``[[A]]`` / ``[[B]]``; 2 answers), "rank" (a ranking, ``[[B>A>C]]``), "auto": pair for 2."""
    answers = list(answers)
    if not all(isinstance(a, str) for a in answers):
        raise TypeError("answers must be strings")
    if kind not in JUDGE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(JUDGE_KINDS)}, got {kind!r}")
    if kind == "pair" and len(answers) != 2:
        raise ValueError(f"a pairwise judgement needs 2 answers, got {len(answers)}")
    pair = kind == "pair" or (kind == "auto" and len(answers) == 2)
    return EvalSample(id=index, task="api", tasktype=PAIRWISE if pair else BEST_OF_N,
                      subtype=str(len(answers)), length="", answers=answers, shown_order=list(range(len(answers))),
                      file="<api>", row=index + 1, prompt_template=_messages(prompt), index=index)


def _mesh(mesh):
    """A Mesh as given, or one built from axis sizes (``evaluate --mesh``'s dict)."""
    if mesh is None or not isinstance(mesh, Mapping):
        return mesh
    return build_mesh(dict(mesh))


def _config(path, *, is_disrm: bool, dtype, mesh, chat_template, max_length, batch_size):
    """The evaluator's settings for ``path`` (dtype None: evaluate's ``--dtype auto``) and the loaded model."""
    path = os.fspath(path)
    dtype = "auto" if dtype is None else dtype if isinstance(dtype, str) else np.dtype(dtype).name
    _check_settings(dtype=dtype, max_length=max_length, batch_size=batch_size)
    mesh_obj = _mesh(mesh)
    cfg = EvalConfig(model_path=path, data_path="", is_disrm=is_disrm, dtype=dtype,
                     max_length=max_length, batch_size=batch_size, chat_template=chat_template, progress=False)
    if not os.path.isdir(path):
        raise ModelDirError(f"{path}: model directory not found")
    _check_head(path, is_disrm)
    cfg.dtype = resolve_dtype(cfg)
    return cfg, mesh_obj, load_model(cfg, mesh_obj)


def _repr(api_object) -> str:
    """``RewardModel('DIR', family=qwen3, layers=36, dtype=bfloat16, max_length=131072)``."""
    config = api_object.model.config
    return (f"{type(api_object).__name__}({api_object.cfg.model_path!r}, family={config.family}, "
            f"layers={config.num_layers}, dtype={api_object.cfg.dtype}, max_length={api_object.cfg.max_length})")


def _check_head(path: str, is_disrm: bool) -> None:
    """Refuse a head that cannot do the job (a causal LM has no trained score head; a classifier cannot write
    a judgement), naming the class that can."""
    architectures = read_hf_config(path).get("architectures") or []
    classifier = any(a.endswith("ForSequenceClassification") for a in architectures)
    causal = any(a.endswith("ForCausalLM") for a in architectures)
    if is_disrm and causal and not classifier:
        raise ModelDirError(f"{path}: a causal LM ({', '.join(architectures)}) has no trained score head to score "
                            "with; load it with longrm_jax.Judge (a generative judge)")
    if not is_disrm and classifier and not causal:
        raise ModelDirError(f"{path}: a sequence classifier ({', '.join(architectures)}) cannot write judgements; "
                            "load it with longrm_jax.RewardModel (or python -m longrm_jax.score)")


@dataclasses.dataclass
class Comparison:
    """``compare``'s result: ``probability`` = P(a preferred over b) = sigmoid(score_a - score_b) (the
    Bradley-Terry model a DisRM is trained on). Floats for one pair, arrays for a batch."""

    probability: float | np.ndarray
    score_a: float | np.ndarray
    score_b: float | np.ndarray


class RewardModel:
    """A discriminative reward model (a ``...ForSequenceClassification`` checkpoint): one score per
    (prompt, response), exactly ``evaluate --is-disrm``'s."""

    def __init__(self, model, tokenizer, cfg, mesh=None):
        self.model, self.tokenizer, self.cfg, self.mesh = model, tokenizer, cfg, mesh

    def __repr__(self) -> str:
        return _repr(self)

    @classmethod
    def from_pretrained(cls, path, *, dtype: str | None = None, mesh=None, chat_template: str | None = None,
                        max_length: int | None = UPSTREAM_MAX_LENGTH, batch_size: int = 4) -> RewardModel:
        """Load a local HF directory (weights + tokenizer). ``dtype``: None scores in the checkpoint's stored
        dtype (evaluate's ``--dtype auto``); ``max_length``: middle truncation as evaluate's ``--max-length``
        (None: none); ``batch_size``: rows per model call."""
        cfg, mesh_obj, model = _config(path, is_disrm=True, dtype=dtype, mesh=mesh, chat_template=chat_template,
                                       max_length=max_length, batch_size=batch_size)
        disrm_tokenizer, _ = load_chat_tokenizers(cfg.model_path, chat_template)
        return cls(model, disrm_tokenizer, cfg, mesh_obj)

    def sequences(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[tuple[np.ndarray, bool]]:
        """(token ids, whether the middle was cut) of each (prompt, response) as it is scored: the chat template
        applied, cut over ``max_length`` as evaluate cuts (the reward server batches these across requests)."""
        samples = [_sample(p, [r], i) for i, (p, r) in enumerate(zip(prompts, responses))]
        return [pair for pairs in disrm_sequences_batch(samples, self.tokenizer, self.cfg.max_length)
                for pair in pairs]

    def _scores(self, prompts: Sequence[Prompt], responses: Sequence[str], progress: bool) -> np.ndarray:
        sequences = [ids for ids, _ in self.sequences(prompts, responses)]
        if not sequences:
            return np.zeros(0, np.float32)
        pad_id = self.model.config.pad_token_id
        scorer = DisRMScorer(self.model, self.tokenizer.pad_id if pad_id is None else pad_id,
                             batch_size=self.cfg.batch_size, max_batch_tokens=self.cfg.max_batch_tokens, mesh=self.mesh)
        return scorer.score(sequences, progress=progress)

    def score(self, prompt: Prompt | Sequence[Prompt], response: str | Sequence[str], *,
              progress: bool = False) -> float | np.ndarray:
        """The reward of ``response`` to ``prompt`` (a float). Batched: a list of responses to one prompt
        (best-of-N), or lists of prompts and responses of one length, give a float32 array."""
        if isinstance(response, str):
            if not _is_one_prompt(prompt):
                raise TypeError("one response takes one prompt (a string or a list of chat messages)")
            return float(self._scores([prompt], [response], progress)[0])
        responses = _strings(response, "response")
        prompts = [prompt] * len(responses) if _is_one_prompt(prompt) else list(prompt)
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses: give one prompt, or one each")
        return self._scores(prompts, responses, progress)

    def compare(self, prompt: Prompt | Sequence[Prompt], a: str | Sequence[str], b: str | Sequence[str], *,
                progress: bool = False) -> Comparison:
        """P(``a`` preferred over ``b``) = sigmoid(r_a - r_b), with both rewards; lists of a and b (one prompt
        or one prompt each) give arrays."""
        if isinstance(a, str) != isinstance(b, str):
            raise TypeError("a and b must both be strings or both be lists")
        if isinstance(a, str):
            score_a, score_b = self.score(prompt, [a, b], progress=progress)
            return Comparison(float(_sigmoid(score_a - score_b)), float(score_a), float(score_b))
        a, b = list(a), list(b)
        if len(a) != len(b):
            raise ValueError(f"{len(a)} answers a for {len(b)} answers b")
        prompts = [prompt] * len(a) if _is_one_prompt(prompt) else list(prompt)
        scores = self.score(prompts + prompts, a + b, progress=progress)
        score_a, score_b = scores[: len(a)], scores[len(a):]
        return Comparison(_sigmoid(score_a.astype(np.float64) - score_b), score_a, score_b)


def _sigmoid(x):
    """Logistic function without overflow for large |x|."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


@dataclasses.dataclass
class Judgement:
    """What a generative judge said about answers shown in the given order (A, B, C, ...).

    ``verdict``: as ``predictions.jsonl`` writes it, the letters best first (``"A>B"`` for a pairwise
    ``[[A]]``, ``"B>C>A"`` for a ranking), None when the text holds no parsable verdict (``parsed`` False; the
    evaluator scores it wrong). ``ranking``: answer indices best first ([] without a verdict); ``best`` its first.
    ``letter_logprobs``: per answer, the log-probability of its letter at the verdict token (the evaluator's
    AUC score; all zeros when unavailable)."""

    verdict: str | None
    ranking: list[int]
    best: int | None
    text: str
    parsed: bool
    letter_logprobs: list[float]
    generated_tokens: int
    stopped: bool  # ended by a stop token (False: hit max_new_tokens)
    truncated: bool  # the prompt was cut in the middle (max_length)


class Judge:
    """A generative reward model (a causal LM trained to judge): the evaluator's judge prompt, greedy decoding
    and verdict parser."""

    def __init__(self, model, tokenizer, cfg, mesh=None):
        self.model, self.tokenizer, self.cfg, self.mesh = model, tokenizer, cfg, mesh

    def __repr__(self) -> str:
        return _repr(self)

    @classmethod
    def from_pretrained(cls, path, *, dtype: str | None = None, mesh=None, chat_template: str | None = None,
                        max_length: int | None = UPSTREAM_MAX_LENGTH, batch_size: int | None = None) -> Judge:
        """Load a local HF directory (weights + tokenizer). ``dtype``: None generates in bfloat16 (evaluate's
        ``--dtype auto`` for a judge); ``batch_size``: decoding slots (None: from the device's memory)."""
        cfg, mesh_obj, model = _config(path, is_disrm=False, dtype=dtype, mesh=mesh, chat_template=chat_template,
                                       max_length=max_length, batch_size=batch_size)
        _, grm_tokenizer = load_chat_tokenizers(cfg.model_path, chat_template)
        return cls(model, grm_tokenizer, cfg, mesh_obj)

    def judge(self, context: str | None, question: str, answers: Sequence[str], *, max_new_tokens: int = 2048,
              kind: str = "auto", progress: bool = False) -> Judgement:
        """Judge ``answers`` (2: pairwise, ``[[A]]`` / ``[[B]]``; more: a ranking) to ``question`` about
        ``context`` (a document; None or "" for none). The judge sees them as evaluate shows a Long-RewardBench
        record whose prompt is ``context`` and ``question`` joined by a blank line. ``kind="rank"`` asks for a
        ranking of two answers too (the prompt of Long-RewardBench's Best-of-N samples)."""
        return self.judge_many([(context, question, answers)], max_new_tokens=max_new_tokens, kind=kind,
                               progress=progress)[0]

    def judge_many(self, examples: Sequence[tuple[str | None, str, Sequence[str]]], *, max_new_tokens: int = 2048,
                   kind: str = "auto", progress: bool = False) -> list[Judgement]:
        """:meth:`judge` of each (context, question, answers), decoded together (continuous batching)."""
        prompts = [("\n\n".join(part for part in (context, question) if part), _strings(answers, "answers"), kind)
                   for context, question, answers in examples]
        return self.judge_prompts(prompts, max_new_tokens=max_new_tokens, progress=progress)

    def judge_prompts(self, examples: Sequence[tuple], *, max_new_tokens: int = 2048,
                      progress: bool = False) -> list[Judgement]:
        """Judgements of (prompt, answers) or (prompt, answers, kind) tuples, a prompt being a string or chat
        messages (a Long-RewardBench ``prompt_template``: the judge sees their contents joined by blank lines),
        ``kind`` as in :meth:`judge`."""
        _check_settings(max_new_tokens=max_new_tokens)
        encoded = [self.encode(*example[:2], i, *example[2:]) for i, example in enumerate(examples)]
        if not encoded:
            return []
        letters = verdict_letter_token_ids(self.tokenizer, max(len(s.answers) for s, _, _ in encoded))
        cfg = dataclasses.replace(self.cfg, max_new_tokens=int(max_new_tokens))
        generator = make_generator(cfg, self.model, self.tokenizer, self.mesh, letters)
        generations = generator.generate([ids for _, ids, _ in encoded], progress=progress, desc="judging")
        return [self.judgement(s, g, ids, cut) for (s, ids, cut), g in zip(encoded, generations)]

    def encode(self, prompt: Prompt, answers: Sequence[str], index: int = 0, kind: str = "auto"):
        """(the evaluator's sample, the judge prompt's token ids, whether its middle was cut) of one judgement;
        its generation becomes a :class:`Judgement` by :meth:`judgement` (a server decodes it among others)."""
        sample = _sample(prompt, answers, index, kind)
        if len(sample.answers) < 2:
            raise ValueError(f"a judgement needs at least 2 answers, got {len(sample.answers)}")
        ids, cut = grm_prompt_ids(sample, self.tokenizer, sample.shown_order, self.cfg.max_length)
        return sample, ids, cut

    def judgement(self, sample, generation, ids, truncated: bool) -> Judgement:
        """The :class:`Judgement` of ``sample``'s ``generation`` from its prompt ``ids`` (:meth:`encode`)."""
        letters = verdict_letter_token_ids(self.tokenizer, len(sample.answers))
        record = grm_prediction(sample, [sample.shown_order], [generation], self.tokenizer.hf, letters, [len(ids)],
                                [truncated])
        ranking = list(preferred_answer_order(sample.shown_order, record["predicted_ranks"]) or [])
        return Judgement(verdict=record["verdict"], ranking=ranking, best=ranking[0] if ranking else None,
                         text=record["output"], parsed=record["verdict"] is not None,
                         letter_logprobs=list(record["answer_scores"]), generated_tokens=record["generated_tokens"],
                         stopped=record["stopped"], truncated=record["truncated"])
