"""Chat-template tokenization with loss masks, as the upstream LongRM trainer builds them.

For a prompt (list of messages) and a response string:

1. `prompt_text = apply_chat_template(prompt, add_generation_prompt=True)`,
   `full_text = apply_chat_template(prompt + [assistant: response])`; `full_text` must start with
   `prompt_text` (else `DataError`), and the response text is the rest, right-stripped of newlines.
2. Prompt and response are tokenized separately (no special tokens added: the template already holds them).
   A response that does not end with the EOS token's text gets `" " + eos_token` appended *as text*, as
   upstream does (`preference.py`, `sft.py`), and its last token is forced to the EOS id. Where EOS is the
   end-of-turn token (Qwen3 and Llama-3.1 Instruct tokenizers) the templated response already ends with it and
   nothing is added; where it is not (Qwen base tokenizers: EOS `<|endoftext|>`, turns end `<|im_end|>`; Llama
   3.1 base: EOS `<|end_of_text|>`, turns end `<|eot_id|>`) the response ends `<end of turn> " " <EOS>`, all
   three trained, exactly as upstream (docs/upstream.md "Training data").
3. `loss_mask` is 1 on every response token (EOS included), 0 on the prompt.

`response_end`: "upstream" (default) is steps 1-2 above. "template" keeps the response exactly as the chat
template writes it after the prompt, its trailing newline included, and appends nothing: the sequence is then
token for token the one `evaluate --is-disrm` scores (the whole conversation through the template), so a DisRM's
score is trained at the position the evaluator reads it. Under "upstream" the two differ by the template's
end-of-turn newline (`<|im_end|>\n` for Qwen-style templates): training scores `<|im_end|>`, the evaluator the
newline after it, as upstream does (docs/upstream.md "The DisRM score position").

`enable_thinking`: False (default) passes `enable_thinking=False` to the template, as upstream evaluation
does; for Qwen3 the empty think block `<think>\\n\\n</think>\\n\\n` then ends the *prompt* and is not trained.
None passes nothing, which reproduces upstream *training* masks exactly (Qwen3: the empty think block is the
first part of the response and is trained). Templates that do not use the variable ignore it.

Truncation policies (`TruncationConfig`), always applied to each sequence on its own (never to a
pair as a whole):
- `prompt_middle` (training default): a sequence longer than `max_length` keeps its whole response and the
  first and last parts of its prompt (system prompt and question survive; the middle of the context goes), as
  the evaluator cuts. The prompt keeps at least `max_length // 8` tokens (or all of it if shorter); only a
  response longer than the rest is right-cut, its last token forced to EOS and trained. On data whose prompts
  fit the row this is upstream's rule (upstream right-cuts each sequence, which never reaches the response).
- `right` (upstream's literal rule): cut to `max_length`, force the last token to EOS and make it a target.
- `middle` (evaluation): a sequence of `max_length` tokens or more keeps its first `middle_head` and last
  `middle_tail` tokens: 65,536 + 65,531 at 131,072.
- `error`: raise.
`TruncationStats` counts what was cut (thread-safe): a warning at the first cut, then one summary line.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Sequence
from typing import Literal

import numpy as np

from longrm_jax.data.hf_tokenizer import TOKENIZER_FILES, load_hf_tokenizer, read_chat_template
from longrm_jax.data.records import DataError, Message, PreferenceRecord, Provenance, SFTRecord

logger = logging.getLogger(__name__)

TruncationPolicy = Literal["prompt_middle", "right", "middle", "error"]
TRUNCATION_POLICIES = ("prompt_middle", "right", "middle", "error")
RESPONSE_ENDS = ("upstream", "template")  # ChatTokenizer(response_end=...), module notes


@dataclasses.dataclass(frozen=True)
class TokenizedSample:
    """One templated sequence: int32 ids and 0/1 int32 loss mask of equal length."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    prompt_len: int
    truncated: bool = False

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclasses.dataclass(frozen=True)
class TokenizedGroup:
    """Samples that must share a packed row: SFT -> (sample,), preference -> (chosen, *rejected)."""

    samples: tuple[TokenizedSample, ...]
    provenance: Provenance

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.samples)


@dataclasses.dataclass(frozen=True)
class TruncationConfig:
    policy: TruncationPolicy = "prompt_middle"
    max_length: int | None = None  # None: no limit (only the packer's row length applies)
    middle_head: int | None = None  # default max_length // 2
    middle_tail: int | None = None  # default max_length // 2 - 5 (upstream: 65,531 at 131,072)

    def __post_init__(self):
        if self.policy not in TRUNCATION_POLICIES:
            raise ValueError(f"truncation policy must be one of {', '.join(TRUNCATION_POLICIES)}, "
                             f"got {self.policy!r}")

    @property
    def head_tail(self) -> tuple[int, int]:
        assert self.max_length is not None
        head = self.middle_head if self.middle_head is not None else self.max_length // 2
        tail = self.middle_tail if self.middle_tail is not None else self.max_length // 2 - 5
        return head, tail


EVAL_MIDDLE_TRUNCATION = TruncationConfig(policy="middle", max_length=131_072)


# Named counters of what the cutting and packing rules did (see `TruncationStats.count`).
RULE_COUNTERS = (
    "prompt_cut_samples",  # prompt cut in its middle to fit the row (response kept whole)
    "response_cut_samples",  # response right-cut because it alone (nearly) fills the row
    "own_row_groups",  # groups too long to share a row, given a row of their own ((1 + R) x row length)
    "identical_pairs_dropped",  # preference groups whose chosen and a rejected came out identical: dropped
)


class TruncationStats:
    """Thread-safe counters of samples seen/truncated, tokens dropped and the rules applied (`RULE_COUNTERS`).

    The user sees one warning at the first cut, and one at the first dropped pair (each naming the row), then
    one :meth:`summary_line` with the totals (the training pipeline logs it at the end of its first pass)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.samples = 0
        self.truncated_samples = 0
        self.dropped_tokens = 0
        self.rules = dict.fromkeys(RULE_COUNTERS, 0)
        self.first_cut: str | None = None  # where the first truncated sample came from
        self.first_dropped_pair: str | None = None

    def count(self, rule: str, n: int = 1, where: str | None = None) -> bool:
        """Add ``n`` to ``rule``; True the first time a dropped pair is counted (``where``: its row)."""
        with self._lock:
            self.rules[rule] += n
            first = rule == "identical_pairs_dropped" and n > 0 and self.first_dropped_pair is None
            if first:
                self.first_dropped_pair = where or "?"
        return first

    def record(self, n_samples: int, n_truncated: int, n_dropped: int, where: str = "") -> None:
        with self._lock:
            self.samples += n_samples
            self.truncated_samples += n_truncated
            self.dropped_tokens += n_dropped
            warn = n_truncated and self.first_cut is None
            if warn:
                self.first_cut = where or "?"
        if warn:
            logger.warning("data: cutting sequences longer than their row (first: %s); one line with the totals "
                           "follows at the end of the first pass over the data (or of the run)", where)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {
                "samples": self.samples,
                "truncated_samples": self.truncated_samples,
                "dropped_tokens": self.dropped_tokens,
                **self.rules,
            }

    def lost_anything(self) -> bool:
        """Whether tokens were cut or pairs dropped (the data summary is then a warning; packing alone is news)."""
        c = self.as_dict()
        return bool(c["truncated_samples"] or c["identical_pairs_dropped"])

    def log_summary(self, log, what: str, policy: str, row_tokens: int) -> None:
        """Log :meth:`summary_line` on ``log`` (a logger): a warning when anything was lost, else info."""
        summary = self.summary_line(what, policy, row_tokens)
        if summary:
            (log.warning if self.lost_anything() else log.info)("%s", summary)

    def summary_line(self, what: str, policy: str, row_tokens: int) -> str | None:
        """One line with what the cutting and packing rules did to ``what`` (e.g. "4096 training records"), or
        None when they touched nothing."""
        c = self.as_dict()
        if not (c["truncated_samples"] or c["identical_pairs_dropped"] or c["own_row_groups"]):
            return None
        parts = [f"{c['truncated_samples']} of {c['samples']} sequences cut to rows of {row_tokens} tokens "
                 f"(data.truncation {policy}: {c['prompt_cut_samples']} prompts cut in the middle, "
                 f"{c['response_cut_samples']} responses cut; {c['dropped_tokens']} tokens dropped)"
                 if c["truncated_samples"] else f"no sequence cut ({c['samples']} fit their rows)"]
        if c["own_row_groups"]:
            parts.append(f"{c['own_row_groups']} groups given a row of their own")
        if c["identical_pairs_dropped"]:
            parts.append(f"{c['identical_pairs_dropped']} pairs dropped as chosen == rejected after the cut "
                         f"(first: {self.first_dropped_pair})")
        return (f"data summary, {what}: " + "; ".join(parts) + ". Per-sample detail: python -m "
                f"longrm_jax.data.inspect_data --data FILE --tokenizer DIR --max-length {row_tokens} "
                f"--truncation {policy}")


# Upstream's evaluation cut: a sequence longer than this many tokens loses its middle.
UPSTREAM_MAX_LENGTH = 131_072


def truncate_middle(ids: Sequence[int] | np.ndarray, max_length: int = UPSTREAM_MAX_LENGTH, head: int | None = None,
                    tail: int | None = None) -> np.ndarray:
    """Upstream evaluation rule: `len >= max_length` keeps the first `head` and the last `tail` tokens."""
    ids = np.asarray(ids)
    head = max_length // 2 if head is None else head
    tail = max_length // 2 - 5 if tail is None else tail
    if len(ids) < max_length:
        return ids
    return np.concatenate([ids[:head], ids[len(ids) - tail:]])


def cut_prompt_middle(sample: TokenizedSample, limit: int, eos_id: int,
                      stats: TruncationStats | None = None) -> TokenizedSample:
    """Policy `prompt_middle` (module notes): fit `sample` into `limit` tokens, cutting the prompt's middle."""
    n, p = len(sample), sample.prompt_len
    if n <= limit:
        return sample
    response_len = n - p
    prompt_keep = min(p, max(limit - response_len, limit // 8))
    head = prompt_keep // 2
    keep = np.r_[0:head, p - (prompt_keep - head):p, p:p + min(response_len, limit - prompt_keep)]
    ids, mask = sample.input_ids[keep].copy(), sample.loss_mask[keep].copy()
    if prompt_keep < p and stats is not None:
        stats.count("prompt_cut_samples")
    if response_len > limit - prompt_keep:
        ids[-1] = eos_id  # as upstream's right cut: EOS last, trained
        mask[-1] = 1
        if stats is not None:
            stats.count("response_cut_samples")
    return TokenizedSample(ids, mask, prompt_keep, truncated=True)


def truncate_sample(sample: TokenizedSample, cfg: TruncationConfig, eos_id: int,
                    provenance: Provenance | None = None, max_length: int | None = None,
                    stats: TruncationStats | None = None) -> TokenizedSample:
    """Apply `cfg` to one sample (`max_length` overrides `cfg.max_length`, e.g. a packer's cap)."""
    limit = cfg.max_length if max_length is None else max_length
    n = len(sample)
    if limit is None:
        return sample
    if cfg.policy == "prompt_middle":
        return cut_prompt_middle(sample, limit, eos_id, stats)
    if cfg.policy == "middle":
        head, tail = cfg.head_tail if max_length is None else (limit // 2, limit - limit // 2 - 5)
        if n < limit:
            return sample
        keep = np.r_[0:head, n - tail:n]
        return TokenizedSample(sample.input_ids[keep], sample.loss_mask[keep],
                               min(sample.prompt_len, head), truncated=True)
    if n <= limit:
        return sample
    if cfg.policy == "error":
        src = provenance.source if provenance else "<sample>"
        where = provenance.where() if provenance else "?"
        raise DataError(src, where, None, f"sequence of {n} tokens exceeds max_length {limit} "
                        "(truncation policy 'error')")
    ids = sample.input_ids[:limit].copy()
    mask = sample.loss_mask[:limit].copy()
    ids[-1] = eos_id  # upstream forces EOS last, and always trains on it (the score is read there)
    mask[-1] = 1
    return TokenizedSample(ids, mask, min(sample.prompt_len, limit), truncated=True)


def _has_enable_thinking(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return "enable_thinking" in template


class ChatTokenizer:
    """Wraps an HF tokenizer: templating, prefix split, masks, truncation. Thread-safe for reading."""

    def __init__(self, tokenizer, *, enable_thinking: bool | None = False, chat_template: str | None = None,
                 response_end: str = "upstream"):
        if response_end not in RESPONSE_ENDS:
            raise ValueError(f"response_end must be one of {', '.join(RESPONSE_ENDS)}; got {response_end!r}")
        self.response_end = response_end
        if chat_template is not None:  # an override (e.g. a base model's tokenizer has none)
            tokenizer.chat_template = chat_template
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer has no chat_template; give one with --chat-template FILE "
                             "(data.chat_template in training)")
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token")
        self.hf = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_id
        self._template_kwargs = {}
        if enable_thinking is not None and _has_enable_thinking(tokenizer):
            self._template_kwargs["enable_thinking"] = enable_thinking
        # The Rust tokenizer directly: ~2x faster than the Python wrapper for long texts.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    @classmethod
    def from_dir(cls, path: str, *, enable_thinking: bool | None = False,
                 chat_template: str | None = None, response_end: str = "upstream") -> ChatTokenizer:
        """Load a tokenizer directory; `chat_template`: a Jinja template *file* replacing the tokenizer's."""
        if not os.path.isdir(path):  # never let transformers take it for a Hub model id (network, retries)
            raise FileNotFoundError(
                f"tokenizer directory {path} does not exist (a local model or tokenizer directory is needed; "
                "the bundled tiny tokenizer is longrm_jax/assets/tiny_tokenizer)")
        if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
            raise FileNotFoundError(f"tokenizer directory {path} holds no tokenizer (none of "
                                    f"{', '.join(TOKENIZER_FILES)}); the bundled tiny tokenizer is "
                                    "longrm_jax/assets/tiny_tokenizer")
        try:
            hf = load_hf_tokenizer(str(path))
        except Exception as error:  # noqa: BLE001 - transformers' text names no path and spans lines
            first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
            raise ValueError(f"tokenizer directory {path}: transformers cannot load it ({first})") from error
        return cls(hf, enable_thinking=enable_thinking, response_end=response_end,
                   chat_template=read_chat_template(chat_template) if chat_template else None)

    # -- text level -------------------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return self.hf.apply_chat_template(list(messages), tokenize=False,
                                           add_generation_prompt=add_generation_prompt,
                                           **self._template_kwargs)

    def response_text(self, prompt: Sequence[Message], prompt_text: str, response: str,
                      provenance: Provenance | None = None) -> str:
        """Templated conversation minus the templated prompt, right-stripped of newlines (upstream), or as the
        template ends it (`response_end="template"`)."""
        full = self.render(list(prompt) + [{"role": "assistant", "content": response}],
                           add_generation_prompt=False)
        if not full.startswith(prompt_text):
            src = provenance.source if provenance else "<sample>"
            where = provenance.where() if provenance else "?"
            raise DataError(src, where, None, "the chat template of prompt+response does not start with the "
                            "templated prompt (add_generation_prompt=True); cannot derive the loss mask")
        rest = full[len(prompt_text):]
        return rest if self.response_end == "template" else rest.rstrip("\n")

    def encode(self, text: str) -> np.ndarray:
        if self._backend is not None:
            ids = self._backend.encode(text, add_special_tokens=False).ids
        else:
            ids = self.hf(text, add_special_tokens=False)["input_ids"]
        return np.asarray(ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """:meth:`encode` of each text; the Rust tokenizer spreads a batch over the CPU cores (an evaluation
        file's 128K-token texts: 6.1 s one by one on this machine's 2 cores)."""
        if self._backend is None:
            return [self.encode(text) for text in texts]
        encodings = self._backend.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    # -- samples ----------------------------------------------------------------------------------------
    def _sample(self, prompt_ids: np.ndarray, response_text: str) -> TokenizedSample:
        if self.response_end == "template":  # the template's own end, as the evaluator renders it
            resp = self.encode(response_text)
        else:
            eos_text = self.hf.eos_token
            if not response_text.endswith(eos_text):  # upstream: text += " " + eos_token (module notes, step 2)
                response_text += " " + eos_text
            resp = self.encode(response_text)
            resp[-1] = self.eos_id  # upstream forces the last token to EOS (a no-op unless EOS is one token)
        ids = np.concatenate([prompt_ids, resp]).astype(np.int32)
        mask = np.zeros(ids.shape, np.int32)
        mask[len(prompt_ids):] = 1
        return TokenizedSample(ids, mask, int(len(prompt_ids)))

    def tokenize_pair(self, prompt: Sequence[Message], responses: Sequence[str],
                      provenance: Provenance | None = None) -> list[TokenizedSample]:
        """Samples for several responses to one prompt (prompt templated and tokenized once)."""
        prompt_text = self.render(prompt, add_generation_prompt=True)
        prompt_ids = self.encode(prompt_text)
        return [self._sample(prompt_ids, self.response_text(prompt, prompt_text, r, provenance))
                for r in responses]

    def tokenize_sft(self, record: SFTRecord, truncation: TruncationConfig = TruncationConfig(),
                     stats: TruncationStats | None = None) -> TokenizedGroup:
        samples = self.tokenize_pair(record.prompt, [record.response], record.provenance)
        return self._finish(samples, record.provenance, truncation, stats)

    def tokenize_preference(self, record: PreferenceRecord, num_rejects: int = 1,
                            truncation: TruncationConfig = TruncationConfig(),
                            stats: TruncationStats | None = None, reject_seed: int | None = None
                            ) -> TokenizedGroup:
        """Group (chosen, `num_rejects` rejected); fewer rejected than `num_rejects` is a DataError.

        The first `num_rejects` rejected are used, or (`reject_seed` given, as upstream's `random.sample`) a
        random subset in their original order, seeded by `reject_seed` and the row index (reproducible).
        """
        if len(record.rejected) < num_rejects:
            p = record.provenance
            raise DataError(p.source, p.where(), "rejected",
                            f"{len(record.rejected)} rejected responses, num_rejects={num_rejects} needed")
        rejected = record.rejected[:num_rejects]
        if reject_seed is not None and len(record.rejected) > num_rejects:
            rng = np.random.default_rng([reject_seed, record.provenance.row])
            picked = sorted(rng.choice(len(record.rejected), num_rejects, replace=False).tolist())
            rejected = tuple(record.rejected[i] for i in picked)
        responses = [record.chosen, *rejected]
        samples = self.tokenize_pair(record.prompt, responses, record.provenance)
        return self._finish(samples, record.provenance, truncation, stats)

    def tokenize(self, record, num_rejects: int = 1, truncation: TruncationConfig = TruncationConfig(),
                 stats: TruncationStats | None = None, reject_seed: int | None = None) -> TokenizedGroup:
        """SFT record -> group of 1; preference record -> group of 1 + `num_rejects` (chosen first)."""
        if isinstance(record, SFTRecord):
            return self.tokenize_sft(record, truncation, stats)
        if isinstance(record, PreferenceRecord):
            return self.tokenize_preference(record, num_rejects, truncation, stats, reject_seed)
        raise TypeError(f"cannot tokenize a {type(record).__name__} for training")

    def _finish(self, samples, provenance, truncation, stats) -> TokenizedGroup:
        out = [truncate_sample(s, truncation, self.eos_id, provenance, stats=stats) for s in samples]
        if stats is not None:
            n_trunc = sum(o.truncated for o in out)
            dropped = sum(len(s) - len(o) for s, o in zip(samples, out))
            stats.record(len(out), n_trunc, dropped, f"{provenance.source} {provenance.where()}")
        return TokenizedGroup(tuple(out), provenance)

    # -- inspection -------------------------------------------------------------------------------------
    def render_masked(self, sample: TokenizedSample, max_chars: int | None = 2000) -> str:
        """Decoded sample, masked-out (untrained) spans in [[...]], trained spans plain."""
        parts = []
        ids, mask = sample.input_ids, sample.loss_mask
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or mask[i] != mask[start]:
                text = self.hf.decode(ids[start:i].tolist(), skip_special_tokens=False)
                parts.append(text if mask[start] else f"[[{text}]]")
                start = i
        out = "".join(parts)
        if max_chars is not None and len(out) > max_chars:
            half = max_chars // 2
            out = out[:half] + f"\n... ({len(out) - max_chars} characters elided) ...\n" + out[-half:]
        return out
