"""Typed records produced by the readers and consumed by tokenization, packing and evaluation.

Every record carries a `Provenance` (source file and 0-based row index; `line` is the 1-based line number
for JSON-lines files) so that any later error can name where the bad data came from.

Messages are lists of `{"role": str, "content": str}` dicts, the format of HF chat templates.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longrm_jax.cli_support import InputError

Message = dict[str, str]

PAIRWISE = "PairWise"
BEST_OF_N = "BestOfN"
TASK_TYPES = (PAIRWISE, BEST_OF_N)
LONG_REWARDBENCH_TASKS = ("LongQA", "Summ", "Safety", "ICL", "Cite", "Code", "Math")
LONGFORM_SUBSETS = ("QA", "RAG", "Chat", "Writing", "Reasoning")


class DataError(InputError):
    """Bad input data: the message names the file, the row or line, and the field."""

    def __init__(self, source: str, where: str, field: str | None, problem: str):
        self.source, self.where, self.field, self.problem = source, where, field, problem
        field_part = f", field '{field}'" if field else ""
        super().__init__(f"{source}: {where}{field_part}: {problem}")


@dataclasses.dataclass(frozen=True)
class Provenance:
    source: str
    row: int  # 0-based index of the record within its source (file or split)
    line: int | None = None  # 1-based line number in a JSON-lines file

    def where(self) -> str:
        return f"line {self.line}" if self.line is not None else f"row {self.row}"


@dataclasses.dataclass(frozen=True)
class SFTRecord:
    """Supervised row: learn `response` (one assistant turn) after the `prompt` messages."""

    prompt: tuple[Message, ...]
    response: str
    provenance: Provenance
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)


@dataclasses.dataclass(frozen=True)
class PreferenceRecord:
    """Preference row: `chosen` is better than every entry of `rejected` (one or more) for `prompt`."""

    prompt: tuple[Message, ...]
    chosen: str
    rejected: tuple[str, ...]
    provenance: Provenance
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)


@dataclasses.dataclass(frozen=True)
class BenchRecord:
    """One Long-RewardBench sample (schema in docs/upstream.md, "Long-RewardBench"), pairwise or Best-of-N.

    `candidates` is always best first: for pairwise `(chosen, rejected)`, for Best-of-N the file's
    `candidates`. `candidate_models` / `candidate_scores` follow the same order (None where the file has none).
    """

    id: str
    prompt: tuple[Message, ...]
    question: str
    task: str
    subtask: str
    tasktype: str
    subtype: str
    candidates: tuple[str, ...]
    candidate_models: tuple[str, ...] | None
    candidate_scores: tuple[float, ...] | None
    ctx_length: str  # ctx_length_for_length bucket, e.g. "32k"
    length: int | None
    provenance: Provenance
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def is_pairwise(self) -> bool:
        return self.tasktype == PAIRWISE

    def to_preference(self) -> PreferenceRecord:
        """The sample as a preference row: best candidate chosen, the others rejected (best first)."""
        return PreferenceRecord(self.prompt, self.candidates[0], self.candidates[1:], self.provenance,
                                meta=dict(self.meta, task=self.task, tasktype=self.tasktype))


@dataclasses.dataclass(frozen=True)
class LongFormRecord:
    """One Long-form RewardBench record (docs/upstream.md, "Long-form RewardBench"): prompt text, chosen list, rejected list."""

    id: str
    prompt: str
    chosen: tuple[str, ...]
    rejected: tuple[str, ...]
    subset: str
    provenance: Provenance
    needle_position: float | None = None  # relative position in [0, 1] of the differing chunk
    length_bucket: str | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def to_preference(self) -> PreferenceRecord:
        """The record as a preference row (first chosen vs all rejected), prompt as one user turn."""
        return PreferenceRecord(
            prompt=({"role": "user", "content": self.prompt},),
            chosen=self.chosen[0],
            rejected=self.rejected,
            provenance=self.provenance,
            meta=dict(self.meta, subset=self.subset),
        )


def chat_messages_problem(value) -> tuple[int | None, str | None, str] | None:
    """What is wrong with ``value`` as chat messages (a non-empty list of ``{"role": str, "content": str}``):
    (message index, key, what), e.g. ``(1, "content", "must be a string, got int")``, or ``(None, None, "must be a
    non-empty list ...")`` for the list itself; None when nothing is. The one rule of every reader of messages
    (score's lines, the API's prompts, the reward server's requests), each wording its error its own way."""
    if not isinstance(value, list) or not value:
        return None, None, "must be a non-empty list of chat messages ({\"role\": ..., \"content\": ...})"
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            return i, None, f"must be an object with 'role' and 'content', got {type(message).__name__}"
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "nothing" if key not in message else type(message[key]).__name__
                return i, key, f"must be a string, got {got}"
    return None
