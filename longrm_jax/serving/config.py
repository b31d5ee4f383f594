"""The reward server's settings: a schema of the kind of the training config's, loaded by the same loader from
``--config FILE``, ``--set KEY=VALUE`` and one flag per key (``longrm_jax.schema_flags``)."""

from __future__ import annotations

from dataclasses import dataclass

from longrm_jax.evaluation.encoding import UPSTREAM_MAX_LENGTH
from longrm_jax.config_rules import check_flat, choice, ranged


@dataclass
class ServeConfig:
    """A reward model served over HTTP: a DisRM's scores, or a generative judge's judgements."""

    # A local Hugging Face checkpoint directory (weights and tokenizer), as `evaluate --model-path` takes.
    model_path: str | None = None
    # The checkpoint is a discriminative RM (a sequence classifier): serve scores; else a generative judge.
    is_disrm: bool = False
    # Address to listen on. The default answers this machine only; 0.0.0.0 answers every interface.
    host: str = "127.0.0.1"
    port: int = ranged(8000, "in [1, 65535]")  # TCP port to listen on
    # Compute dtype; auto: a DisRM the checkpoint's, a judge bfloat16 (as evaluate's --dtype auto).
    dtype: str = choice("auto", ("auto", "float32", "bfloat16"))
    # Longest sequence in tokens. Longer ones with a known prompt lose the middle of their prompt (as evaluate
    # cuts); a query without a known prompt boundary is refused (413).
    max_length: int = ranged(UPSTREAM_MAX_LENGTH, ">= 16")
    # DisRM: sequences per model call at most. A judge: sequences decoded together at most (fewer where the
    # device's memory holds fewer at a prompt's length).
    batch_size: int = ranged(16, ">= 1")
    max_batch_tokens: int = ranged(131_072, ">= 16")  # DisRM: padded tokens per model call at most
    # How long the first request of a batch waits for others to join it, in milliseconds.
    max_delay_ms: float = ranged(5.0, ">= 0")
    # Sequences waiting to be scored at most; a request beyond is answered 503 with Retry-After.
    max_queue: int = ranged(4096, ">= 1")
    max_new_tokens: int = ranged(2048, ">= 1")  # a judgement's token budget (a request's max_tokens lowers it)
    # Persistent XLA compilation cache: auto ($JAX_COMPILATION_CACHE_DIR, else ~/.cache/longrm_jax/xla), off, or
    # a directory (longrm_jax.compile_cache). A restart on the same shapes then reads its programs, not compiles.
    compilation_cache: str = "auto"

    def validate(self) -> "ServeConfig":
        check_flat(self, {"model_path": "DIR, a local Hugging Face checkpoint directory"})
        return self
