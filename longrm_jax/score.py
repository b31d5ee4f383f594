"""Score (prompt, response) rows with a discriminative reward model: ``python -m longrm_jax.score``.

JSON lines in, JSON lines out, for best-of-N and rejection sampling. Each input line is
``{"prompt": ..., "response": "..."}`` or ``{"prompt": ..., "responses": ["...", ...]}`` (a prompt being a string
or a list of chat messages); each output line is the input object with ``"score"`` (resp. ``"scores"``, one per
response, in order) added. The scores are those of :class:`longrm_jax.api.RewardModel` and so of
``python -m longrm_jax.evaluate --is-disrm``. Every line is checked before the model loads; a bad one stops the
run with one line naming the file, the line and the field (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from longrm_jax.cli_support import (InputError, add_debug_flag, cli_parser, configure_logging, run_cli,
                                    silence_absl_warnings)
from longrm_jax.data.records import DataError, chat_messages_problem
from longrm_jax.data.tokenize import UPSTREAM_MAX_LENGTH
from longrm_jax.config_rules import check_flat, choice, ranged


DESCRIPTION = ("Score responses with a discriminative reward model (a ...ForSequenceClassification checkpoint "
               "directory with its tokenizer). Input: JSON lines {\"prompt\": str or chat messages, \"response\": "
               "str} or {..., \"responses\": [str, ...]}. Output: the same objects with \"score\" / \"scores\" "
               "added, the numbers evaluate --is-disrm computes for the same text.")
# The reward model's stack (longrm_jax.api: jax, the models, transformers' tokenizers) is imported inside the
# functions that use it, so that `--help` and a refused input line answer without loading it.


@dataclass
class ScoreConfig:
    """Responses scored by a discriminative reward model. Read from ``--config FILE``, ``--set KEY=VALUE`` and one
    flag per key (``longrm_jax.schema_flags``), as every CLI's settings are."""

    model_path: str | None = None  # Local Hugging Face reward model directory.
    input: str | None = None  # JSON lines to score (- for stdin).
    output: str = "-"  # Where the scored lines go (- for stdout); written aside and renamed when done.
    # Compute dtype; auto: the checkpoint's stored dtype, as evaluate.
    dtype: str = choice("auto", ("auto", "bfloat16", "float32", "float16"))
    batch_size: int = ranged(4, ">= 1")  # Rows per model call.
    chunk: int = ranged(256, ">= 1")  # Responses tokenized and scored per chunk before their lines are written.
    max_length: int = ranged(UPSTREAM_MAX_LENGTH, ">= 16")  # Middle truncation at this many tokens, as evaluate.
    truncate: bool = True  # Cut sequences longer than max_length in the middle (false: score every one whole).
    chat_template: str | None = None  # Jinja chat template file used instead of the tokenizer's.
    mesh: str | None = None  # Device mesh, e.g. fsdp=2 or data=2,seq=2 (null: one device).
    progress: bool = True  # A progress bar on a terminal.
    # Persistent XLA compilation cache: auto ($JAX_COMPILATION_CACHE_DIR, else ~/.cache/longrm_jax/xla), off, or
    # a directory (longrm_jax.compile_cache).
    compilation_cache: str = "auto"

    def validate(self) -> ScoreConfig:
        check_flat(self, {"model_path": "DIR, a local Hugging Face reward model directory",
                          "input": "FILE, the JSON lines to score (- for stdin)"})
        return self


def build_parser() -> argparse.ArgumentParser:
    from longrm_jax.schema_flags import add_schema_flags

    parser = cli_parser("longrm_jax.score", DESCRIPTION, examples=[
        "python -m longrm_jax.score --model-path runs/tiny_disrm_hf --input candidates.jsonl --output scored.jsonl"],
        show_defaults=True)
    add_schema_flags(parser, ScoreConfig)
    add_debug_flag(parser)
    return parser


def _check_prompt(value, where, path) -> None:
    if isinstance(value, str) or chat_messages_problem(value) is None:
        return
    raise DataError(path, where, "prompt", "must be a string or a non-empty list of chat messages "
                                           "({\"role\": ..., \"content\": ...})")


def check_row(row, path: str, line: int) -> int:
    """The number of responses of one input object; DataError naming the line and field when it is malformed."""
    where = f"line {line}"
    if not isinstance(row, dict):
        raise DataError(path, where, None, f"expected a JSON object, got {type(row).__name__}")
    if "prompt" not in row:
        raise DataError(path, where, "prompt", "missing field")
    _check_prompt(row["prompt"], where, path)
    if ("response" in row) == ("responses" in row):
        raise DataError(path, where, "response", "give exactly one of 'response' (a string) and 'responses' "
                                                 "(a list of strings)")
    if "response" in row:
        if not isinstance(row["response"], str):
            raise DataError(path, where, "response", f"must be a string, got {type(row['response']).__name__}")
        return 1
    responses = row["responses"]
    if not isinstance(responses, list) or not responses:
        raise DataError(path, where, "responses", "must be a non-empty list of strings")
    for i, item in enumerate(responses):
        if not isinstance(item, str):
            raise DataError(path, where, f"responses[{i}]", f"must be a string, got {type(item).__name__}")
    return len(responses)


def read_rows(lines: Sequence[str], path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) of every non-blank line, each checked (:func:`check_row`)."""
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(path, f"line {number}", None, f"not valid JSON ({error.msg} at column {error.colno})") \
                from None
        check_row(row, path, number)
        yield number, row


def _read_lines(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.read().splitlines()
    if not os.path.isfile(path):
        raise InputError(f"--input {path}: no such file")
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise InputError(f"--input {path}: line {line} is not UTF-8 (byte 0x{data[error.start]:02x}); JSON lines "
                         "are UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8)") from None


def _check_args(args: ScoreConfig) -> None:
    if not os.path.isdir(args.model_path):
        raise InputError(f"--model-path {args.model_path}: not a directory (a local Hugging Face reward model "
                         "directory is needed)")
    if args.chat_template is not None and not os.path.isfile(args.chat_template):
        raise InputError(f"--chat-template {args.chat_template}: no such file")
    if args.output != "-" and args.input != "-" and os.path.abspath(args.output) == os.path.abspath(args.input):
        raise InputError(f"--output {args.output} is the input file; name another")
    if args.output != "-" and os.path.isdir(args.output):
        raise InputError(f"--output {args.output} is a directory; name a file (the scored lines go there)")


def _chunks(rows: list[tuple[int, dict]], size: int) -> Iterator[list[dict]]:
    """Consecutive rows holding about ``size`` responses each (a row is never split)."""
    chunk, count = [], 0
    for _, row in rows:
        chunk.append(row)
        count += 1 if "response" in row else len(row["responses"])
        if count >= size:
            yield chunk
            chunk, count = [], 0
    if chunk:
        yield chunk


def score_rows(model, rows: list[tuple[int, dict]], out, *, chunk: int, progress: bool) -> int:
    """Score ``rows`` chunk by chunk with ``model`` (a RewardModel), writing each scored line to ``out``."""
    total = sum(1 if "response" in row else len(row["responses"]) for _, row in rows)
    from tqdm.auto import tqdm  # noqa: PLC0415 - a dependency: --help and refused inputs answer without it

    with tqdm(total=total, unit="response", desc="scoring", disable=not progress) as bar:
        for part in _chunks(rows, chunk):
            prompts, responses = [], []
            for row in part:
                answers = [row["response"]] if "response" in row else row["responses"]
                prompts += [row["prompt"]] * len(answers)
                responses += answers
            scores = [float(s) for s in model.score(prompts, responses)]
            for row in part:
                if "response" in row:
                    row["score"] = scores.pop(0)
                else:
                    row["scores"] = [scores.pop(0) for _ in row["responses"]]
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
            bar.update(len(responses))
    return total


def _score(argv: Sequence[str]) -> int:
    from longrm_jax.schema_flags import config_from_args

    args = config_from_args(build_parser().parse_args(argv), ScoreConfig)  # a refusal: run_cli's one line, exit 2
    from longrm_jax.evaluation.config import parse_mesh

    configure_logging()
    silence_absl_warnings()
    _check_args(args)
    try:
        mesh = parse_mesh(args.mesh) if args.mesh else None
    except ValueError as error:
        raise InputError(f"--mesh: {error}") from None
    source = "<stdin>" if args.input == "-" else args.input
    rows = list(read_rows(_read_lines(args.input), source))  # every line checked before the model loads
    if not rows:
        raise InputError(f"--input {source}: no lines to score")
    from longrm_jax.api import RewardModel
    from longrm_jax.compile_cache import enable_compilation_cache

    enable_compilation_cache(args.compilation_cache)

    model = RewardModel.from_pretrained(args.model_path, dtype=None if args.dtype == "auto" else args.dtype,
                                        mesh=mesh, chat_template=args.chat_template, batch_size=args.batch_size,
                                        max_length=args.max_length if args.truncate else None)
    progress = args.progress and sys.stderr.isatty()
    if args.output == "-":
        total = score_rows(model, rows, sys.stdout, chunk=args.chunk, progress=progress)
        sys.stdout.flush()
    else:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        try:
            with open(args.output + ".tmp", "w", encoding="utf-8") as out:
                total = score_rows(model, rows, out, chunk=args.chunk, progress=progress)
            os.replace(args.output + ".tmp", args.output)
        finally:
            if os.path.exists(args.output + ".tmp"):
                os.remove(args.output + ".tmp")
    print(f"scored {total} responses of {len(rows)} lines" +
          ("" if args.output == "-" else f" into {args.output}"), file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_score, argv)


if __name__ == "__main__":
    sys.exit(main())
