"""DisRM scoring with the prompt computed once per sample (``--share-prompt``), an exact-math shortcut.

A sample's 2 to 4 scored sequences are ``template(prompt + [assistant: answer_i])``: they share a long token
prefix (the templated context, often > 99% of the tokens) and differ in a short suffix. Scoring them one by
one (upstream, and :class:`~longrm_jax.evaluation.scoring.DisRMScorer`) recomputes that prefix for every
answer; here the prefix is run once into a KV cache and each answer's suffix attends to it:

1. ``p`` = the longest common token prefix of the sample's sequences (at most the shortest length - 1, so
   every answer keeps at least one token of its own). No template knowledge is needed, and middle-truncated
   sequences work too (their common prefix is just shorter).
2. The prefix, right-padded to a length bucket, fills a fresh cache (``prefill``: fast attention kernel).
   The buckets are fitted to the prefixes of the whole task file (padding FLOPs against compiles), not a
   fixed ladder: a 131,104-token prefix is padded to 131,200, not 196,608.
3. Each suffix, padded to a multiple of ``chunk``, is run in chunks of ``chunk`` tokens (bounded memory for
   the masked attention over the whole cache) on a copy of the prefix cache; the score is the head at the
   suffix token that HF's pooling picks (rightmost non-pad of the full sequence).

Attention of the suffix tokens to the prefix is the same softmax over the same keys, so the scores equal the
one-by-one scores up to floating-point reassociation. Not used on a mesh (one row per call).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from longrm_jax.data.packing import bucket_for
from longrm_jax.evaluation.batching import fit_buckets
from longrm_jax.evaluation.grm.estimate import prefill_flops
from longrm_jax.evaluation.scoring import hf_pooled_index
from longrm_jax.evaluation.timings import Timings
from longrm_jax.models.cache import KVCache
from longrm_jax.ops.contract import PAD_POSITION, round_up


def common_prefix_length(sequences: Sequence[np.ndarray]) -> int:
    """Length of the longest common prefix, capped so that every sequence keeps one token after it."""
    shortest = min(len(s) for s in sequences)
    first = np.asarray(sequences[0][:shortest])
    agree = np.ones(shortest, bool)
    for seq in sequences[1:]:
        agree &= np.asarray(seq[:shortest]) == first
    prefix = shortest if agree.all() else int(np.argmin(agree))
    return max(0, min(prefix, shortest - 1))


def _prefill(model, ids, positions, *, max_len: int):
    """The prefix into a fresh cache; no segment ids (fast causal kernel), pads at ``PAD_POSITION``."""
    cfg = model.config
    cache = KVCache.create(cfg.num_layers, ids.shape[0], max_len, cfg.num_kv_heads, cfg.head_dim,
                           cfg.compute_dtype)
    _, cache = model.model(ids, positions, None, cache=cache, prefill=True)
    return cache


def _suffix_score(model, cache, ids, positions, pooled, *, chunk: int):
    """Run the suffix [1, T] (T a multiple of ``chunk``) chunk by chunk; label-0 score at index ``pooled``."""
    num_chunks = ids.shape[1] // chunk
    ids_c = ids.reshape(1, num_chunks, chunk).transpose(1, 0, 2)
    pos_c = positions.reshape(1, num_chunks, chunk).transpose(1, 0, 2)

    def step(cache, xs):
        chunk_ids, chunk_pos = xs
        hidden, cache = model.model(chunk_ids, chunk_pos, jnp.ones_like(chunk_ids), cache=cache)
        return cache, hidden[0]

    _, hidden = jax.lax.scan(step, cache, (ids_c, pos_c))
    pooled_hidden = hidden.reshape(-1, hidden.shape[-1])[pooled]
    return (pooled_hidden @ model.score[...].astype(pooled_hidden.dtype))[0].astype(jnp.float32)


@functools.lru_cache(maxsize=None)
def _jitted(max_len: int, chunk: int):
    return (jax.jit(functools.partial(_prefill, max_len=max_len)),
            jax.jit(functools.partial(_suffix_score, chunk=chunk)))


# What one more prefix bucket must save to be worth its compile, in forward FLOPs: ~4-5 s to compile the
# prefill and suffix programs of an 8B model (37.6 s of first calls for six buckets, their own runs included;
# docs/perf_eval.md, "Buckets fitted to the run") at ~450 TFLOP/s of prefill. A heuristic: it trades
# padding against compiles only, scores do not depend on it.
NEW_BUCKET_FLOPS = 2e15

# Buckets compiled in this process: chunk -> {prefix bucket: largest suffix bucket compiled with it}. Later
# task files of a run plan with them as free buckets (the jitted functions are cached per shape).
_COMPILED: dict[int, dict[int, int]] = {}


class SharedPromptScorer:
    """Scores groups of sequences sharing a prefix (one group = one sample's answers).

    :meth:`score_groups` sees a whole task file's groups before running any: the prefix buckets are fitted to
    their lengths (:func:`~longrm_jax.evaluation.batching.fit_buckets`, FLOPs of padding against
    ``new_bucket_flops`` per compile), and each prefix bucket's suffix bucket is its groups' longest suffix.
    ``timings`` accumulates ``compile_s`` (first call of each shape, run included), ``prefill_s`` (the other
    calls) and token counts.
    """

    def __init__(self, model, pad_id: int, *, chunk: int = 128, new_bucket_flops: float = NEW_BUCKET_FLOPS):
        self.model = model
        self.pad_id = int(pad_id)
        self.config_pad_id = model.config.pad_token_id
        self.chunk = chunk
        self.new_bucket_flops = new_bucket_flops
        self.timings = Timings({"compile_s": 0.0, "prefill_s": 0.0, "prefill_tokens": 0,
                                "padded_prefill_tokens": 0, "suffix_tokens": 0})

    def score_groups(self, groups: Sequence[Sequence[np.ndarray]], progress: bool = False,
                     desc: str = "DisRM scoring (shared prompt)", repeats: float = 1.0) -> list[np.ndarray]:
        """float32 scores per group, each equal to scoring its sequences alone.

        ``repeats``: how often this mix of lengths is expected in the whole run (the evaluator passes the
        run's samples / these groups: the task files of a benchmark share their length mix). Padding is paid
        per sample of the run and a compile once, so a small file alone would merge buckets that the run as a
        whole wants apart (one sample per context size would pad 32K prefixes to 64K)."""
        compiled = _COMPILED.setdefault(self.chunk, {})
        prefixes = [common_prefix_length(group) for group in groups]
        prefix_buckets = fit_buckets([max(p, 1) for p in prefixes],
                                     lambda n: repeats * prefill_flops(self.model.config, n),
                                     new_bucket_cost=self.new_bucket_flops, multiple=self.chunk, ready=compiled)
        plan = []  # prefix bucket per group
        longest_suffix: dict[int, int] = {}
        for group, prefix in zip(groups, prefixes):
            bucket = bucket_for(max(prefix, 1), prefix_buckets)
            suffix = round_up(max(1, max(len(s) for s in group) - prefix), self.chunk)
            longest_suffix[bucket] = max(longest_suffix.get(bucket, 0), suffix)
            plan.append(bucket)
        # A compiled suffix shape at least as long is reused (a few more chunks cost less than a compile).
        suffix_of = {b: compiled[b] if compiled.get(b, 0) >= s else s for b, s in longest_suffix.items()}
        order = sorted(range(len(groups)), key=lambda i: -plan[i])  # longest first: compiles and OOMs early
        out: list = [None] * len(groups)
        for index in tqdm(order, desc=desc, unit="sample", disable=not progress):
            bucket = plan[index]
            out[index] = self._score(groups[index], prefixes[index], bucket, suffix_of[bucket])
        return out

    def score_group(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        """float32 [len(sequences)] scores, equal to scoring each sequence alone."""
        return self.score_groups([sequences])[0]

    def _score(self, sequences, prefix: int, prefix_bucket: int, suffix_bucket: int) -> np.ndarray:
        begin = time.perf_counter()
        prefill, suffix_score = _jitted(prefix_bucket + suffix_bucket, self.chunk)
        ids = np.full((1, prefix_bucket), self.pad_id, np.int32)
        ids[0, :prefix] = sequences[0][:prefix]
        columns = np.arange(prefix_bucket, dtype=np.int32)
        positions = np.where(columns < prefix, columns, PAD_POSITION).astype(np.int32)[None]
        cache = prefill(self.model, ids, positions)
        scores = []
        for seq in sequences:
            full = np.asarray(seq, np.int32)[None]
            pooled = int(hf_pooled_index(full, np.array([len(seq)]), self.config_pad_id)[0]) - prefix
            pooled = max(pooled, 0)  # HF's index in the prefix would mean a sequence of pads: score its start
            suffix = np.full((1, suffix_bucket), self.pad_id, np.int32)
            suffix[0, : len(seq) - prefix] = seq[prefix:]
            positions = (prefix + np.arange(suffix_bucket, dtype=np.int32))[None]
            # The prefix cache is an immutable value: every answer starts from the same one.
            scores.append(suffix_score(self.model, cache, suffix, positions, pooled))
        result = np.asarray(jax.device_get(jnp.stack(scores)), np.float32)
        compiled = _COMPILED[self.chunk]
        first = compiled.get(prefix_bucket, 0) < suffix_bucket
        compiled[prefix_bucket] = max(compiled.get(prefix_bucket, 0), suffix_bucket)
        self.timings.add({"compile_s" if first else "prefill_s": time.perf_counter() - begin,
                          "prefill_tokens": prefix, "padded_prefill_tokens": prefix_bucket,
                          "suffix_tokens": sum(len(s) - prefix for s in sequences)})
        return result
