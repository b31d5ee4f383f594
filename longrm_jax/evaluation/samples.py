"""Evaluation samples: benchmark records validated, with the answers' shown order (the position-bias control).

Records are read and validated by ``longrm_jax.data.readers`` (format detected from the fields); two
families are evaluated:

* **Long-RewardBench** (``{Task}.jsonl``): ``prompt_template`` (chat messages holding the long context),
  ``tasktype`` ``"PairWise"`` (``chosen``, ``rejected``) or ``"BestOfN"`` (``candidates``, best first),
  ``subtype``, ``ctx_length_for_length``. A record without ``tasktype`` is pairwise (as upstream).
* **Long-form RewardBench**: ``prompt`` (a string), ``chosen`` (a list holding one response), ``rejected`` (a
  list), ``subset``; needle-test records also carry the needle's relative position (``tagged_position``, the
  benchmark's name, or ``needle_position`` / ``position``, in [0, 1]) and a response length bucket
  (``length_bucket``, else ``word_count``, the benchmark's name, ``length`` or ``response_length``).

Shown order, upstream-compatible: per task file a ``random.Random(seed)`` (seed 42 by default) first shuffles
the list of records, then, visiting records in that shuffled order, shuffles ``range(n_answers)`` for each.
Position j then shows answer ``shown_order[j]``; since answers are stored best first, ``shown_order[j]`` is
also the gold rank of position j. Python's ``random`` consumes the same draws for a list of any element type,
so the permutations equal upstream's exactly.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from collections.abc import Sequence
from typing import Any

from longrm_jax.cli_support import InputError
from longrm_jax.data.readers import RecordSource
from longrm_jax.data.records import BenchRecord, DataError, LongFormRecord
from longrm_jax.evaluation.metrics import BEST_OF_N, DEFAULT_TASKS, PAIRWISE

logger = logging.getLogger(__name__)

LONG_REWARDBENCH = "long-rewardbench"
LONG_FORM = "long-form"
DEFAULT_SEED = 42
# The benchmark's needle data gives the response length as `word_count` (divide_result_bon2pair.py)
NEEDLE_LENGTH_FIELDS = ("word_count", "length", "response_length")


class BenchDataError(InputError):
    """A task file that cannot be evaluated (missing, empty, wrong kind); the message names the file.

    Bad *records* raise ``longrm_jax.data.records.DataError`` (file, line and field)."""


@dataclasses.dataclass
class EvalSample:
    """One benchmark record ready to judge. ``answers`` are in gold order (best first)."""

    id: Any
    task: str  # task file name (Long-RewardBench) or subset (Long-form): the results.csv grouping key
    tasktype: str  # "PairWise" | "BestOfN"
    subtype: str
    length: str  # length bucket label, e.g. "32k"
    answers: list[str]
    shown_order: list[int]
    file: str
    row: int  # 1-based line number in ``file``
    benchmark: str = LONG_REWARDBENCH
    prompt_template: list[dict] | None = None  # Long-RewardBench chat messages
    prompt: str | None = None  # Long-form user prompt
    source: str | None = None
    subtask: str | None = None
    index: int = 0  # upstream's index: position among the file's kept records
    needle_position: float | None = None
    num_chosen: int = 1  # Long-form: answers[:num_chosen] are chosen, the rest rejected (all tied)

    @property
    def judge_kind(self) -> str:
        return "rank" if self.tasktype == BEST_OF_N else "pair"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.row}"

    def prompt_messages(self) -> list[dict]:
        """The chat messages that precede an answer (the task prompt incl. the long context)."""
        if self.prompt_template is not None:
            return [dict(m) for m in self.prompt_template]
        return [{"role": "user", "content": self.prompt or ""}]

    def shown_answers(self, shown_order: Sequence[int] | None = None) -> list[str]:
        order = self.shown_order if shown_order is None else shown_order
        return [self.answers[i] for i in order]


def _line(provenance) -> int:
    return provenance.line if provenance.line is not None else provenance.row + 1


def sample_from_bench_record(record: BenchRecord, task: str) -> EvalSample:
    """An :class:`EvalSample` of a validated Long-RewardBench record (shown order still unset)."""
    path, row = record.provenance.source, _line(record.provenance)
    if not record.ctx_length:
        raise DataError(path, record.provenance.where(), "ctx_length_for_length",
                        "missing field (the length bucket, e.g. '32k')")
    subtype = record.subtype or (str(len(record.candidates)) if record.tasktype == BEST_OF_N else "diff")
    return EvalSample(
        id=record.id, task=task, tasktype=record.tasktype, subtype=subtype, length=record.ctx_length,
        answers=list(record.candidates), shown_order=list(range(len(record.candidates))), file=path, row=row,
        prompt_template=[dict(m) for m in record.prompt], source=record.meta.get("source"),
        subtask=record.subtask or None,
    )


def sample_from_long_form_record(record: LongFormRecord) -> EvalSample:
    """An :class:`EvalSample` of a Long-form RewardBench record: every chosen must beat every rejected."""
    answers = list(record.chosen) + list(record.rejected)
    length = record.length_bucket or next(
        (str(record.meta[f]) for f in NEEDLE_LENGTH_FIELDS if record.meta.get(f) is not None), "all")
    return EvalSample(
        id=record.id, task=record.subset, tasktype=PAIRWISE if len(answers) == 2 else BEST_OF_N,
        subtype=str(len(answers)), length=length, answers=answers, shown_order=list(range(len(answers))),
        file=record.provenance.source, row=_line(record.provenance), benchmark=LONG_FORM, prompt=record.prompt,
        needle_position=record.needle_position, num_chosen=len(record.chosen),
    )


def _count_records(path: str) -> int:
    with open(path, encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


def assign_shown_orders(samples: list[EvalSample], seed: int = DEFAULT_SEED) -> None:
    """Upstream's seeded permutation per sample (see module docstring); sets ``index`` and ``shown_order``."""
    rng = random.Random(seed)
    visit = list(range(len(samples)))
    rng.shuffle(visit)
    for position, sample in enumerate(samples):
        sample.index = position
    for i in visit:
        order = list(range(len(samples[i].answers)))
        rng.shuffle(order)
        samples[i].shown_order = order


def load_task_file(path: str, task: str | None = None, seed: int = DEFAULT_SEED) -> list[EvalSample]:
    """Read, validate (``longrm_jax.data.readers``) and order one task file of either family.

    Errors (``DataError``/``BenchDataError``) name the file, the line and the field.
    """
    task = task or os.path.splitext(os.path.basename(path))[0]
    if not os.path.isfile(path):
        raise BenchDataError(f"{path}: task file not found")
    if _count_records(path) == 0:
        raise BenchDataError(f"{path}: the task file is empty (no records)")
    source = RecordSource(path, format="auto")
    if source.format not in ("long_rewardbench", "longform"):
        raise BenchDataError(f"{path}: records look like '{source.format}' data, not Long-RewardBench "
                             "(prompt_template, tasktype, ...) or Long-form RewardBench (prompt, chosen, rejected, "
                             "subset)")
    samples = []
    for record in source.records():
        if isinstance(record, LongFormRecord):
            samples.append(sample_from_long_form_record(record))
        else:
            samples.append(sample_from_bench_record(record, task))
    assign_shown_orders(samples, seed)
    return samples


def discover_task_files(data_path: str, tasks: Sequence[str] | None) -> list[tuple[str, str]]:
    """(task, file) pairs to evaluate.

    With ``tasks``: ``{data_path}/{Task}.jsonl`` for each, all required. Without: the upstream task list
    (LongQA, Summ, Safety, ICL, Cite, Code, Math) where present, in that order, else every ``*.jsonl`` in the
    directory (e.g. Long-form RewardBench subsets). A single ``.jsonl`` file is accepted (its stem is the task).
    """
    if os.path.isfile(data_path):
        return [(os.path.splitext(os.path.basename(data_path))[0], data_path)]
    if not os.path.isdir(data_path):
        raise BenchDataError(f"{data_path}: data path is neither a directory nor a .jsonl file")
    if tasks:
        pairs = [(task, os.path.join(data_path, f"{task}.jsonl")) for task in tasks]
        missing = [path for _, path in pairs if not os.path.isfile(path)]
        if missing:
            there = sorted(os.path.splitext(f)[0] for f in os.listdir(data_path) if f.endswith(".jsonl"))
            raise BenchDataError(f"task file(s) not found: {', '.join(missing)}; --tasks can name "
                                 f"{', '.join(there) if there else 'none: no .jsonl files in ' + data_path}")
        return pairs
    upstream = [(t, os.path.join(data_path, f"{t}.jsonl")) for t in DEFAULT_TASKS]
    present = [(t, p) for t, p in upstream if os.path.isfile(p)]
    if present:
        if len(present) < len(upstream):
            missing = [t for t, p in upstream if not os.path.isfile(p)]
            logger.warning("%s: no task file for %s; evaluating the %d present", data_path, missing, len(present))
        return present
    found = sorted(name for name in os.listdir(data_path) if name.endswith(".jsonl"))
    if not found:
        raise BenchDataError(f"{data_path}: no *.jsonl task files")
    return [(os.path.splitext(name)[0], os.path.join(data_path, name)) for name in found]


def gold_ranks(sample: EvalSample, shown_order: Sequence[int] | None = None) -> list[int]:
    """Gold rank per shown position (Long-RewardBench: the answer index; Long-form: 0 chosen / 1 rejected)."""
    order = sample.shown_order if shown_order is None else shown_order
    if sample.benchmark == LONG_FORM:
        return [0 if i < sample.num_chosen else 1 for i in order]
    return list(order)
