"""Readers: local files -> validated, typed records with provenance.

Sources (`open_rows`): JSON lines (`.jsonl`, parsed line by line so that an invalid line is named; rows are
read lazily through a byte-offset index), JSON (`.json`: a list of objects, or an object holding one list),
parquet (through `datasets`), and `datasets.save_to_disk` directories (a `DatasetDict` needs `split`).

Formats (`parse_*`, or `format="auto"`, detected from the first row's fields):
- `sft`: upstream SFT rows: `chat_template` (messages; prompt) + `golden` (target); without `golden`, a final
  assistant message of `chat_template`/`messages` is the target. `prompt` (messages or text) + `response` too,
  and TRL's prompt-completion rows (`prompt` + `completion`: text, or one assistant message).
- `preference`: upstream rows (`chat_template`, `chosen` str, `rejects` list) and generic rows (`prompt`
  messages or text, `chosen`, `rejected` str or list), TRL's preference rows included: conversational
  (`chosen` / `rejected` one assistant message each) and with an implicit prompt (no `prompt`; `chosen` and
  `rejected` whole conversations that share every turn but their last, assistant one).
- `long_rewardbench`: Long-RewardBench `{Task}.jsonl` rows (docs/upstream.md, "Long-RewardBench"), PairWise and BestOfN (no
  `tasktype`: pairwise, as upstream).
- `longform`: Long-form RewardBench records (docs/upstream.md, "Long-form RewardBench").

Bad rows (missing field, wrong type, empty response, unknown `tasktype`, invalid JSON line) raise `DataError`
naming file, row or line, and field. `RecordSource(..., skip_bad_rows=True).records()` logs and counts them
instead (`source.skipped`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tqdm import tqdm

from longrm_jax.data.records import (BEST_OF_N, LONGFORM_SUBSETS, PAIRWISE, TASK_TYPES, BenchRecord, DataError,
                                     LongFormRecord, PreferenceRecord, Provenance, SFTRecord)

logger = logging.getLogger(__name__)

FORMATS = ("auto", "sft", "preference", "long_rewardbench", "longform")


# ---------------------------------------------------------------------------------------------------------
# Raw rows
# ---------------------------------------------------------------------------------------------------------
class JsonLinesRows:
    """Random access to the objects of a JSON-lines file (blank lines skipped), lines parsed on demand."""

    def __init__(self, path: str):
        self.path = path
        self._offsets: list[int] = []
        self._lines: list[int] = []
        with open(path, "rb") as f:
            offset = 0
            for line_no, line in enumerate(f, start=1):
                if line.strip():
                    self._offsets.append(offset)
                    self._lines.append(line_no)
                offset += len(line)

    def __len__(self) -> int:
        return len(self._offsets)

    def line_of(self, i: int) -> int:
        return self._lines[i]

    def __getitem__(self, i: int) -> dict:
        with open(self.path, "rb") as f:
            f.seek(self._offsets[i])
            raw = f.readline()
        try:
            obj = json.loads(text := raw.decode("utf-8-sig"))  # a BOM is allowed, as json.loads(bytes) allows it
        except json.JSONDecodeError as e:  # its own "line 2 column 1" counts within the row: give the offset
            where = "at the end of the row (cut short?)" if not text[e.pos:].strip() else f"at character {e.pos + 1}"
            raise DataError(self.path, f"line {self._lines[i]}", None,
                            f"invalid JSON ({e.msg.removesuffix(' at')} {where})") from None
        except UnicodeDecodeError as e:
            raise DataError(self.path, f"line {self._lines[i]}", None, f"invalid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise DataError(self.path, f"line {self._lines[i]}", None,
                            f"expected a JSON object, got {type(obj).__name__}")
        return obj


class ListRows:
    """Rows held in memory (a `.json` file) or behind a `datasets.Dataset` (parquet, save_to_disk)."""

    def __init__(self, path: str, rows):
        self.path = path
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def line_of(self, i: int) -> None:
        return None

    def __getitem__(self, i: int) -> dict:
        row = self._rows[i]
        if not isinstance(row, dict):
            raise DataError(self.path, f"row {i}", None, f"expected an object, got {type(row).__name__}")
        return row


def _load_json_file(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        try:
            obj = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(path, f"line {e.lineno}", None, f"invalid JSON ({e.msg}, column {e.colno})") from None
    if isinstance(obj, dict):
        lists = [k for k, v in obj.items() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError(path, "top level", None, "expected a list of rows or an object holding one list")
        obj = obj[lists[0]]
    if not isinstance(obj, list):
        raise DataError(path, "top level", None, f"expected a list of rows, got {type(obj).__name__}")
    return obj


def open_rows(path: str, split: str | None = None):
    """Random-access raw rows of `path` (see module docstring for the supported sources)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        import datasets  # heavy (pyarrow): only for a saved dataset or parquet

        try:
            ds = datasets.load_from_disk(path)
        except FileNotFoundError as e:
            raise DataError(path, "directory", None, f"not a datasets save_to_disk directory ({e})") from None
        if isinstance(ds, datasets.DatasetDict):
            if split is None:
                split = "train" if "train" in ds else None
            if split not in ds:
                raise DataError(path, "splits", None, f"split {split!r} not found; available: {sorted(ds)}")
            return ListRows(os.path.join(path, split), ds[split])
        return ListRows(path, ds)
    if not os.path.exists(path):
        missing = path
        while missing and not os.path.exists(os.path.dirname(missing) or "."):
            missing = os.path.dirname(missing)
        where = "" if missing == path else f" (no {missing} either)"
        raise FileNotFoundError(f"data file {path} does not exist{where}; expected a .jsonl, .json or .parquet file "
                                "or a datasets save_to_disk directory")
    if path.endswith((".jsonl", ".jsonlines", ".ndjson")):
        return JsonLinesRows(path)
    if path.endswith(".json"):
        return ListRows(path, _load_json_file(path))
    if path.endswith(".parquet"):
        import datasets  # heavy (pyarrow): only for a saved dataset or parquet

        return ListRows(path, datasets.Dataset.from_parquet(path))
    raise DataError(path, "file", None, "unknown file type (expected .jsonl, .json, .parquet or a directory)")


# ---------------------------------------------------------------------------------------------------------
# Field validation
# ---------------------------------------------------------------------------------------------------------
_MISSING = object()


class _Row:
    """A raw row with its provenance; typed getters raise DataError naming the field."""

    def __init__(self, row: dict, prov: Provenance):
        self.row, self.prov = row, prov

    def error(self, field: str | None, problem: str) -> DataError:
        return DataError(self.prov.source, self.prov.where(), field, problem)

    def has(self, field: str) -> bool:
        return self.row.get(field) is not None

    def get(self, field: str) -> Any:
        if field not in self.row or self.row[field] is None:
            raise self.error(field, "missing field")
        return self.row[field]

    def text(self, field: str, value: Any = _MISSING, allow_empty: bool = False) -> str:
        value = self.get(field) if value is _MISSING else value
        if not isinstance(value, str):
            raise self.error(field, f"expected a string, got {type(value).__name__}")
        if not allow_empty and not value.strip():
            raise self.error(field, "empty response" if field.split("[")[0] in _RESPONSE_FIELDS else "empty string")
        return value

    def text_list(self, field: str, min_len: int = 1, allow_str: bool = False) -> tuple[str, ...]:
        value = self.get(field)
        if isinstance(value, str) and allow_str:
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise self.error(field, f"expected a list of strings, got {type(value).__name__}")
        if len(value) < min_len:
            raise self.error(field, f"expected at least {min_len} entries, got {len(value)}")
        return tuple(self.text(f"{field}[{i}]", v) for i, v in enumerate(value))

    def messages(self, field: str) -> tuple[dict[str, str], ...]:
        value = self.get(field)
        if isinstance(value, str):  # a plain-text prompt is one user turn
            return ({"role": "user", "content": self.text(field, value)},)
        if not isinstance(value, (list, tuple)) or not value:
            raise self.error(field, f"expected a non-empty list of messages or a string, got {_describe(value)}")
        out = []
        for i, m in enumerate(value):
            if not isinstance(m, dict):
                raise self.error(f"{field}[{i}]", f"expected a {{role, content}} object, got {type(m).__name__}")
            for key in ("role", "content"):
                if not isinstance(m.get(key), str):
                    raise self.error(f"{field}[{i}].{key}", "missing field" if m.get(key) is None
                                     else f"expected a string, got {type(m[key]).__name__}")
            out.append({"role": m["role"], "content": m["content"]})
        return tuple(out)

    def response(self, field: str, value: Any = _MISSING) -> str:
        """A response given as text or, as TRL's conversational rows give it, as one assistant message."""
        value = self.get(field) if value is _MISSING else value
        if _is_messages(value):
            if len(value) != 1:
                raise self.error(field, f"expected one assistant message, got {len(value)} messages")
            role = value[0].get("role")
            if role != "assistant":
                raise self.error(f"{field}[0].role", f"expected 'assistant', got {role!r}")
            return self.text(f"{field}[0].content", value[0].get("content"))
        return self.text(field, value)

    def responses(self, field: str) -> tuple[str, ...]:
        """One or more responses: text, a list of texts, or one assistant message (TRL's conversational rows)."""
        value = self.get(field)
        if _is_messages(value):
            return (self.response(field, value),)
        return self.text_list(field, allow_str=True)

    def meta(self, used: set[str]) -> dict:
        return {k: v for k, v in self.row.items() if k not in used and isinstance(v, (str, int, float, bool))}


_RESPONSE_FIELDS = {"golden", "response", "completion", "chosen", "rejected", "rejects", "candidates"}


def _is_messages(value) -> bool:
    """A non-empty list of message objects (TRL's conversational responses), not a list of texts."""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(m, dict) for m in value)


def _describe(value) -> str:
    return "an empty list" if isinstance(value, (list, tuple)) and not value else type(value).__name__


def parse_sft(r: _Row) -> SFTRecord:
    prompt_field = next((f for f in ("chat_template", "messages", "prompt") if r.has(f)), "chat_template")
    prompt = r.messages(prompt_field)
    response_field = next((f for f in ("golden", "response", "completion") if r.has(f)), None)
    if response_field is not None:
        if prompt[-1]["role"] == "assistant":
            raise r.error(prompt_field, f"ends with an assistant turn and '{response_field}' is also given")
        response = r.response(response_field)
    elif prompt[-1]["role"] == "assistant" and len(prompt) > 1:
        response = r.text(f"{prompt_field}[{len(prompt) - 1}].content", prompt[-1]["content"])
        prompt = prompt[:-1]
    else:
        raise r.error("golden", "missing field (and the messages do not end with an assistant turn)")
    return SFTRecord(prompt, response, r.prov, r.meta({prompt_field, response_field or ""}))


def parse_preference(r: _Row) -> PreferenceRecord:
    rejected_field = "rejects" if r.has("rejects") else "rejected"
    if not r.has("chat_template") and not r.has("prompt"):
        return _implicit_prompt_preference(r, rejected_field)
    prompt_field = "chat_template" if r.has("chat_template") else "prompt"
    prompt = r.messages(prompt_field)
    chosen = r.response("chosen")
    rejected = r.responses(rejected_field)
    return PreferenceRecord(prompt, chosen, rejected, r.prov, r.meta({prompt_field, "chosen", rejected_field}))


def _implicit_prompt_preference(r: _Row, rejected_field: str) -> PreferenceRecord:
    """TRL's implicit-prompt rows: ``chosen`` and ``rejected`` are whole conversations; the prompt is the turns
    they share, each one's last (assistant) turn its response."""
    chosen, rejected = r.messages("chosen"), r.messages(rejected_field)
    for field, conversation in (("chosen", chosen), (rejected_field, rejected)):
        if len(conversation) < 2 or conversation[-1]["role"] != "assistant":
            raise r.error(field, "missing prompt: without a 'prompt' field, chosen and rejected must be "
                                 "conversations ending in an assistant turn")
    if chosen[:-1] != rejected[:-1]:
        raise r.error(rejected_field, "without a 'prompt' field, chosen and rejected must share every turn but "
                                      "their last; they differ before it")
    return PreferenceRecord(chosen[:-1], r.text(f"chosen[{len(chosen) - 1}].content", chosen[-1]["content"]),
                            (r.text(f"{rejected_field}[{len(rejected) - 1}].content", rejected[-1]["content"]),),
                            r.prov, r.meta({"chosen", rejected_field}))


def parse_long_rewardbench(r: _Row) -> BenchRecord:
    # Upstream treats a row without `tasktype` as pairwise; an unknown value is an error. A row without it that
    # has no `chosen` is not a pairwise row missing its answer: say that its tasktype is what is missing.
    tasktype = r.text("tasktype") if "tasktype" in r.row and r.row["tasktype"] is not None else PAIRWISE
    if r.row.get("tasktype") is None and not r.has("chosen") and not r.has("rejected"):
        hint = "BestOfN (it has candidates)" if r.has("candidates") else f"one of {', '.join(TASK_TYPES)}"
        raise r.error("tasktype", f"missing: a Long-RewardBench row without tasktype is read as PairWise and needs "
                      f"chosen and rejected; this row has neither, so set tasktype to {hint}")
    if tasktype not in TASK_TYPES:
        raise r.error("tasktype", f"unknown tasktype {tasktype!r} (expected one of {', '.join(TASK_TYPES)})")
    prompt = r.messages("prompt_template")
    models = scores = None
    if tasktype == PAIRWISE:
        candidates = (r.text("chosen"), r.text("rejected"))
        if r.has("chosen_model") and r.has("rejected_model"):
            models = (str(r.get("chosen_model")), str(r.get("rejected_model")))
    else:
        candidates = r.text_list("candidates", min_len=2)
        if r.has("candidates_model"):
            models = tuple(str(m) for m in r.get("candidates_model"))
        if r.has("candidates_score"):
            raw = r.get("candidates_score")
            if not isinstance(raw, (list, tuple)) or len(raw) != len(candidates) or not all(
                    isinstance(s, (int, float)) and not isinstance(s, bool) for s in raw):
                raise r.error("candidates_score", f"expected {len(candidates)} numbers")
            scores = tuple(float(s) for s in raw)
    default_task = os.path.splitext(os.path.basename(r.prov.source))[0]
    length = r.row.get("length")
    return BenchRecord(
        id=str(r.get("id")), prompt=prompt, question=str(r.row.get("question") or ""),
        task=str(r.row.get("task") or default_task), subtask=str(r.row.get("subtask") or ""),
        tasktype=tasktype, subtype=str(r.row.get("subtype") if r.row.get("subtype") is not None else ""),
        candidates=candidates, candidate_models=models, candidate_scores=scores,
        ctx_length=str(r.row.get("ctx_length_for_length") or ""),
        length=int(length) if isinstance(length, (int, float)) else None, provenance=r.prov,
        meta=r.meta({"prompt_template", "chosen", "rejected", "candidates"}))


NEEDLE_POSITION_FIELDS = ("tagged_position", "needle_position", "position")


def parse_longform(r: _Row) -> LongFormRecord:
    subset = r.text("subset")
    if subset not in LONGFORM_SUBSETS:
        logger.debug("%s %s: subset %r is not one of %s", r.prov.source, r.prov.where(), subset, LONGFORM_SUBSETS)
    # The benchmark's needle data names the relative position `tagged_position` (divide_result_bon2pair.py)
    field = next((f for f in NEEDLE_POSITION_FIELDS if r.row.get(f) is not None), NEEDLE_POSITION_FIELDS[0])
    pos = r.row.get(field)
    if pos is not None and not (isinstance(pos, (int, float)) and 0.0 <= float(pos) <= 1.0):
        raise r.error(field, f"expected a number in [0, 1], got {pos!r}")
    bucket = r.row.get("length_bucket")
    return LongFormRecord(
        id=str(r.row.get("id", r.prov.row)), prompt=r.text("prompt"),
        chosen=r.text_list("chosen", allow_str=True), rejected=r.text_list("rejected", allow_str=True),
        subset=subset, provenance=r.prov, needle_position=None if pos is None else float(pos),
        length_bucket=None if bucket is None else str(bucket),
        meta=r.meta({"prompt", "chosen", "rejected"}))


PARSERS: dict[str, Callable[[_Row], Any]] = {
    "sft": parse_sft, "preference": parse_preference,
    "long_rewardbench": parse_long_rewardbench, "longform": parse_longform,
}


def detect_format(row: dict) -> str:
    """Guess the format from a row's fields."""
    if "tasktype" in row or "prompt_template" in row:
        return "long_rewardbench"
    if "chosen" in row and ("rejects" in row or "rejected" in row):
        if "subset" in row and isinstance(row.get("prompt"), str) and isinstance(row.get("chosen"), list):
            return "longform"
        return "preference"
    if "golden" in row or "response" in row or "messages" in row or "chat_template" in row or "completion" in row:
        return "sft"
    raise ValueError(f"cannot detect the data format from fields {sorted(row)}")


# ---------------------------------------------------------------------------------------------------------
# Record sources
# ---------------------------------------------------------------------------------------------------------
class RecordSource:
    """Random-access validated records of one file/directory. `source[i]` raises DataError on a bad row."""

    def __init__(self, path: str, format: str = "auto", split: str | None = None, skip_bad_rows: bool = False):
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        self.path = os.fspath(path)
        self.rows = open_rows(self.path, split)
        self.source_name = getattr(self.rows, "path", self.path)
        self.skip_bad_rows = skip_bad_rows
        self.skipped = 0
        if format == "auto":
            format = self._detect()
        self.format = format
        self._parse = PARSERS[format]

    def _detect(self) -> str:
        if not len(self.rows):
            raise DataError(self.source_name, "file", None, "no rows (the file or split is empty)")
        for i in range(min(len(self.rows), 16)):
            try:
                return detect_format(self.rows[i])
            except DataError:
                continue
            except ValueError as e:
                raise DataError(self.source_name, self._where(i), None, str(e)) from None
        raise DataError(self.source_name, "file", None, "no readable row to detect the format from; name it with "
                        f"--format (one of {', '.join(f for f in FORMATS if f != 'auto')})")

    def _where(self, i: int) -> str:
        line = self.rows.line_of(i)
        return f"line {line}" if line is not None else f"row {i}"

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = self.rows[i]
        return self._parse(_Row(row, Provenance(self.source_name, i, self.rows.line_of(i))))

    def records(self, progress: bool = False) -> Iterator:
        """All records in order; bad rows raise, or are logged and counted when `skip_bad_rows`."""
        indices: Sequence[int] = range(len(self))
        if progress:
            indices = tqdm(indices, desc=f"reading {os.path.basename(self.source_name)}", unit="row")
        for i in indices:
            try:
                yield self[i]
            except DataError as e:
                if not self.skip_bad_rows:
                    raise
                self.skipped += 1
                logger.warning("skipping bad row: %s", e)


def read_records(path: str, format: str = "auto", split: str | None = None, skip_bad_rows: bool = False,
                 return_skipped: bool = False):
    """Read and validate every row of `path` into a list of records (and the skip count if asked)."""
    src = RecordSource(path, format, split, skip_bad_rows)
    out = list(src.records())
    return (out, src.skipped) if return_skipped else out


def read_long_rewardbench(data_dir: str, tasks: Sequence[str] | None = None, skip_bad_rows: bool = False
                          ) -> dict[str, list[BenchRecord]]:
    """`{task: records}` from `{data_dir}/{Task}.jsonl` (default: every `*.jsonl` there, sorted)."""
    if tasks is None:
        tasks = sorted(os.path.splitext(f)[0] for f in os.listdir(data_dir) if f.endswith(".jsonl"))
    return {t: read_records(os.path.join(data_dir, f"{t}.jsonl"), "long_rewardbench", skip_bad_rows=skip_bad_rows)
            for t in tasks}


__all__ = ["FORMATS", "RecordSource", "read_records", "read_long_rewardbench", "open_rows", "detect_format",
           "BEST_OF_N", "PAIRWISE"]
