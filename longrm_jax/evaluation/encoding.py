"""Token ids the evaluator feeds a model: DisRM (prompt + answer) sequences and GRM judge prompts.

Upstream rules reproduced here:

* DisRM: each answer alone, ``prompt_template + [{"role": "assistant", "content": answer}]`` templated
  without a generation prompt (and without ``enable_thinking``, as upstream), scored at its last token.
* GRM: the judge messages of :mod:`longrm_jax.evaluation.prompts`, templated with a generation prompt and
  ``enable_thinking=False`` (Qwen3: the empty think block ends the prompt).
* Middle truncation (default): a sequence of 131,072 tokens or more keeps its first 65,536 and last 65,531.
  Upstream's GRM path decodes the truncated ids back to text and re-tokenizes it; we keep the ids (no
  re-tokenization drift at the cut). ``max_length=None`` disables truncation (``--no-truncate``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from longrm_jax.cli_support import InputError
from longrm_jax.data.hf_tokenizer import TOKENIZER_FILES, load_hf_tokenizer, read_chat_template
from longrm_jax.data.tokenize import UPSTREAM_MAX_LENGTH, ChatTokenizer, truncate_middle
from longrm_jax.evaluation.prompts import judge_messages, position_letter
from longrm_jax.evaluation.samples import EvalSample


class ModelDirError(InputError):
    """The model directory cannot be evaluated (missing tokenizer, config...); the message names the path."""


def load_chat_tokenizers(model_path: str, chat_template: str | None = None) -> tuple[ChatTokenizer, ChatTokenizer]:
    """(DisRM tokenizer: template kwargs untouched, GRM tokenizer: ``enable_thinking=False``) for a model dir.

    ``chat_template``: a Jinja template file used instead of the tokenizer's (needed where it has none)."""
    if not os.path.isdir(model_path):
        raise ModelDirError(f"{model_path}: model directory not found")
    present = [name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(model_path, name))]
    if not present:
        raise ModelDirError(
            f"{model_path}: no tokenizer in the model directory (expected one of {', '.join(TOKENIZER_FILES)}); "
            "copy the tokenizer files next to the weights"
        )
    try:
        hf_tokenizer = load_hf_tokenizer(model_path)
    except Exception as error:  # noqa: BLE001 - re-raised with the path for the user
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        raise ModelDirError(f"{model_path}: cannot load the tokenizer ({type(error).__name__}: {first})") from error
    try:
        template = read_chat_template(chat_template) if chat_template else None
        return (ChatTokenizer(hf_tokenizer, enable_thinking=None, chat_template=template),
                ChatTokenizer(hf_tokenizer, enable_thinking=False, chat_template=template))
    except FileNotFoundError as error:
        raise ModelDirError(str(error)) from None
    except ValueError as error:
        raise ModelDirError(f"{model_path}/tokenizer_config.json: {error}") from error


def stop_token_ids(model_path: str, tokenizer: ChatTokenizer) -> list[int]:
    """EOS ids that end a generation: the tokenizer's EOS plus ``generation_config.json``'s ``eos_token_id``.

    (For Llama 3.1 the latter lists ``<|eot_id|>``, which ends an assistant turn; upstream adds it by model name.)
    """
    ids = {tokenizer.eos_id}
    config_path = os.path.join(model_path, "generation_config.json")
    if os.path.isfile(config_path):
        with open(config_path) as handle:
            eos = json.load(handle).get("eos_token_id")
        if eos is not None:
            ids.update(int(i) for i in (eos if isinstance(eos, list) else [eos]))
    return sorted(ids)


def verdict_letter_token_ids(tokenizer: ChatTokenizer, num_letters: int = 4) -> list[int]:
    """Token id of each letter A, B, ... as the tokenizer writes it after ``[[``; -1 if not a single token."""
    ids = []
    for position in range(num_letters):
        letter = position_letter(position)
        encoded = [int(i) for i in tokenizer.encode("[[" + letter)]
        prefix = [int(i) for i in tokenizer.encode("[[")]
        tail = encoded[len(prefix):] if encoded[: len(prefix)] == prefix else []
        ids.append(tail[0] if len(tail) == 1 else -1)
    return ids


def maybe_truncate(ids: np.ndarray, max_length: int | None) -> tuple[np.ndarray, bool]:
    """Upstream middle truncation at ``max_length`` (None: keep everything)."""
    if max_length is None or len(ids) < max_length:
        return ids, False
    return truncate_middle(ids, max_length), True


def disrm_sequences(
    sample: EvalSample, tokenizer: ChatTokenizer, max_length: int | None = UPSTREAM_MAX_LENGTH
) -> list[tuple[np.ndarray, bool]]:
    """One (ids, truncated) per answer, in the sample's stored (gold) order."""
    return disrm_sequences_batch([sample], tokenizer, max_length)[0]


def disrm_sequences_batch(
    samples: Sequence[EvalSample], tokenizer: ChatTokenizer, max_length: int | None = UPSTREAM_MAX_LENGTH
) -> list[list[tuple[np.ndarray, bool]]]:
    """:func:`disrm_sequences` of each sample, the texts tokenized as one batch (in parallel)."""
    texts, owners = [], []
    for index, sample in enumerate(samples):
        messages = sample.prompt_messages()
        for answer in sample.answers:
            texts.append(tokenizer.render(messages + [{"role": "assistant", "content": answer}],
                                          add_generation_prompt=False))
            owners.append(index)
    out: list[list[tuple[np.ndarray, bool]]] = [[] for _ in samples]
    for owner, ids in zip(owners, tokenizer.encode_batch(texts)):
        out[owner].append(maybe_truncate(ids, max_length))
    return out


def grm_prompt_ids(
    sample: EvalSample,
    tokenizer: ChatTokenizer,
    shown_order: Sequence[int] | None = None,
    max_length: int | None = UPSTREAM_MAX_LENGTH,
) -> tuple[np.ndarray, bool]:
    """(ids, truncated) of the judge prompt showing the answers in ``shown_order`` (default: the sample's)."""
    messages = judge_messages(sample.prompt_messages(), sample.shown_answers(shown_order), sample.judge_kind)
    text = tokenizer.render(messages, add_generation_prompt=True)
    return maybe_truncate(np.asarray(tokenizer.encode(text), dtype=np.int32), max_length)
