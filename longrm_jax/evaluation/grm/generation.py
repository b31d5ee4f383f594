"""Greedy generation for generative reward models: jitted prefill, then a jitted ``lax.while_loop`` decode.

Shapes are static per length bucket: a batch of B prompts right-padded to L tokens gets a preallocated KV
cache of L + max_new_tokens slots. Pads follow each prompt, so causality hides them during the prefill, and
they are written with position ``PAD_POSITION`` so that no decode query (which sees cached keys of positions
<= its own) attends to them either; the prefill thus needs no segment ids and keeps the fastest kernel. Each
row continues from its own length (position ``len_b + step``) while all rows write the same slot per step.
The decode loop stops when every row has emitted a stop token or ``max_new_tokens`` were produced; a row
that has stopped emits the pad id from then on.

Two jitted functions instead of one so that the prefill can run under a mesh with a ``seq`` axis (ring
attention over a zigzag-ordered prompt, for contexts one device cannot hold) while the decode steps (one
token: nothing to split over ``seq``) run outside it; the cache stays wherever the prefill left it.

Besides tokens the loop records, at every step, the log-probabilities of the verdict letters ``A``, ``B``,
... (their token ids given by the caller), from which the evaluator reads P("A") vs P("B") at the verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from tqdm.auto import tqdm

from longrm_jax.evaluation.batching import pad_rows, plan_batches
from longrm_jax.evaluation.grm.continuous import continuous_generate, generate_live, memory_slots
from longrm_jax.evaluation.grm.decoding import Generation, letter_logprobs
from longrm_jax.evaluation.grm.slot_plan import plan_pools
from longrm_jax.evaluation.scoring import mesh_sizes, warn_past_positions
from longrm_jax.evaluation.timings import Timings
from longrm_jax.models.layers import constrain
from longrm_jax.ops.contract import PAD_POSITION
from longrm_jax.parallel.placement import place_batch
from longrm_jax.parallel.target import target_of
from longrm_jax.parallel.zigzag import zigzag_permutation

logger = logging.getLogger(__name__)


# Prefills run each layer's MLP on token chunks of this many tokens (models.layers.tiled_mlp): a 128K-token
# prompt's [T, 2, F] gate/up buffer (Qwen3-8B: 9 GiB with its product) would otherwise stand beside the slots'
# caches; with it a second 128K slot fits an 80 GB GPU (docs/perf_eval.md "Slots from memory at every length").
PREFILL_MLP_CHUNK_TOKENS = 8192


def prepare_for_decoding(model, mesh: Mesh | None = None, decode_attention: str = "auto",
                         unroll_layers: bool | None = None, mlp_chunk_tokens: int = PREFILL_MLP_CHUNK_TOKENS):
    """Put ``model`` (a causal LM) in the inference weight layout, in place, once per loaded model: q/k/v and
    gate/up each stored as one weight (:meth:`longrm_jax.models.decoder.Decoder.fuse_projections`), so that
    every decode step runs one matmul for each. Outputs are the same; the fused model is for evaluation only
    (not for training or HF export). Returns ``model``.

    ``decode_attention`` (``ModelConfig.decode_attention``): ``auto`` picks the Triton kernel that reads the
    stacked cache in place (``pallas``) on one GPU, XLA's formulation elsewhere (the kernel is not partitioned
    over a mesh). With the kernel, decode steps also unroll the layer loop (``ModelConfig.unroll_cached_layers``)
    unless ``unroll_layers`` is False: no loop counter, weight slices or layer-index copies per layer, ~5% faster
    per token at batch 1 for ~8 s more compile per decode program (docs/perf_eval.md, "The unrolled decode step";
    the evaluator decides by the run's size, ``evaluation.runner.unroll_decode_layers``).

    ``mlp_chunk_tokens``: prompts longer than this run their MLPs in token chunks (0: whole prompts); decode
    steps (one token) are unaffected."""
    model.model.fuse_projections()
    model.replace_config(mlp_chunk_tokens=mlp_chunk_tokens)
    if decode_attention == "auto":
        one_device = mesh is None or mesh.size == 1
        decode_attention = "pallas" if target_of(mesh).is_gpu and one_device else "xla"
    if decode_attention == "xla":
        unroll_layers = None  # measured (and chosen) with the kernel only
    elif unroll_layers is None:
        unroll_layers = True
    model.use_decode_attention(decode_attention, unroll_layers=unroll_layers)
    return model


def _constrain_cache(cache):
    """Under a mesh: cache slots split like the prompt tokens (rows over data x fsdp, slots over seq, kv heads
    over tensor), so a long context's cache is spread over the seq devices; the local layers' rings of a split
    cache (a window's slots, models.window_cache) are not split over seq. A no-op without a mesh."""
    kv_names = (None, "batch", "seq", "act_kv_heads", None)
    cache = dataclasses.replace(
        cache, k=constrain(cache.k, kv_names, None), v=constrain(cache.v, kv_names, None),
        positions=constrain(cache.positions, ("batch", "seq"), None),
        segment_ids=constrain(cache.segment_ids, ("batch", "seq"), None))
    if cache.ring is None:
        return cache
    ring_names = (None, "batch", None, "act_kv_heads", None)
    return dataclasses.replace(
        cache, local_k=constrain(cache.local_k, ring_names, None), local_v=constrain(cache.local_v, ring_names, None),
        local_positions=constrain(cache.local_positions, ("batch", None), None),
        local_segment_ids=constrain(cache.local_segment_ids, ("batch", None), None))


def _prefill(model, input_ids, positions, last_index, letter_ids, *, max_len: int):
    """Fill a fresh cache with the prompts; return (cache, first token [B], its letter log-probs [B, nL]).

    No segment ids (so the fastest causal kernel runs): pads follow each prompt and carry ``PAD_POSITION``.
    """
    cache = _constrain_cache(model.init_cache(input_ids.shape[0], max_len))
    logits, cache = model(input_ids, positions=positions, cache=cache, prefill=True, logits_at=last_index)
    cache = _constrain_cache(cache)
    last = logits[:, 0]
    return cache, jnp.argmax(last, axis=-1).astype(jnp.int32), letter_logprobs(last, letter_ids)


def _decode(model, cache, first_token, first_letters, lengths, stop_ids, letter_ids, *, max_new: int,
            pad_id: int):
    """Greedy decode loop; returns (tokens [B, max_new], letter log-probs [B, max_new, nL], steps taken, cache).

    The final cache is returned (callers may drop it) so that a donated input cache can alias it: a donated
    buffer that no output can take is unusable, and XLA then copies the whole cache into the loop state on
    entry (2 x 2.4 GB for Qwen3-8B at 32K, twice the cache memory and ~2 ms per call)."""
    batch = first_token.shape[0]
    tokens = jnp.full((batch, max_new), pad_id, jnp.int32).at[:, 0].set(first_token)
    letters = jnp.zeros((batch, max_new, letter_ids.shape[0]), jnp.float32).at[:, 0].set(first_letters)
    done = jnp.isin(first_token, stop_ids)

    def cond(state):
        step, _, done, *_ = state
        return (step + 1 < max_new) & ~jnp.all(done)

    def body(state):
        step, token, done, cache, tokens, letters = state
        positions = (lengths + step)[:, None]
        logits, cache = model(token[:, None], positions=positions, segment_ids=jnp.ones_like(positions),
                              cache=cache)
        nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        nxt = jnp.where(done, pad_id, nxt)
        tokens = tokens.at[:, step + 1].set(nxt)
        letters = letters.at[:, step + 1].set(letter_logprobs(logits[:, 0], letter_ids))
        done = done | jnp.isin(nxt, stop_ids)
        return step + 1, nxt, done, cache, tokens, letters

    state = (jnp.zeros((), jnp.int32), first_token, done, cache, tokens, letters)
    step, _, _, cache, tokens, letters = jax.lax.while_loop(cond, body, state)
    return tokens, letters, step + 1, cache


@functools.lru_cache(maxsize=None)
def _jitted_prefill(max_len: int):
    return jax.jit(partial(_prefill, max_len=max_len))


@functools.lru_cache(maxsize=None)
def _jitted_decode(max_new: int, pad_id: int, donate_cache: bool):
    # Donating the cache lets the loop update it in place (the CPU backend does not support donation).
    return jax.jit(partial(_decode, max_new=max_new, pad_id=pad_id), donate_argnums=(1,) if donate_cache else ())


class GreedyGenerator:
    """Batched greedy generation with a preallocated KV cache; one compile per (rows, bucket) shape.

    Two schedules, same outputs: ``continuous=True`` (default on one device) keeps a fixed number of slots
    busy, refilling a finished row with the next prompt (:mod:`longrm_jax.evaluation.grm.continuous`), its slot
    count ``batch_size`` or, when that is None, chosen from the device's memory
    (:func:`longrm_jax.evaluation.grm.continuous.memory_slots`; ``memory_bytes`` overrides the device's
    limit); ``decode_chunk`` decode steps run per host round trip. ``continuous=False`` (and any mesh of
    more than one device) runs static batches of ``batch_size`` rows (4 when None) per length bucket, capped
    by ``max_batch_tokens``, each decoded until its last row is done.

    ``mesh``: rows are split over data x fsdp; with ``seq`` > 1 prompts are also padded to a multiple of
    2 x seq, put in zigzag order and prefilled with ring attention under the mesh, the KV cache's slots split
    over ``seq`` (contexts longer than one device holds); decoding then runs on that sharded cache.
    """

    def __init__(
        self,
        model,
        *,
        pad_id: int,
        stop_ids: Sequence[int],
        max_new_tokens: int = 2048,
        letter_ids: Sequence[int] = (),
        batch_size: int | None = 4,
        max_batch_tokens: int | None = 131_072,
        mesh: Mesh | None = None,
        continuous: bool = False,
        decode_chunk: int = 16,
        memory_bytes: int | None = None,
    ):
        self.model = model
        self.pad_id = int(pad_id)
        self.stop_ids = jnp.asarray(sorted(set(int(i) for i in stop_ids)), jnp.int32)
        self.max_new_tokens = int(max_new_tokens)
        self.letter_ids = jnp.asarray(list(letter_ids) or [-1], jnp.int32)
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.mesh = mesh
        self.continuous = continuous and (mesh is None or mesh.size == 1)
        if continuous and not self.continuous:
            logger.info("continuous batching runs on one device; static batches on the %d-device mesh", mesh.size)
        if decode_chunk < 1:
            raise ValueError(f"decode_chunk must be >= 1, got {decode_chunk}")
        self.decode_chunk = int(decode_chunk)
        self.memory_bytes = memory_bytes
        self.timings = Timings()  # the last generate call's phases (the runner adds up the calls')
        _, self.seq_size = mesh_sizes(mesh)
        self._decode = _jitted_decode(self.max_new_tokens, self.pad_id, target_of(mesh).platform != "cpu")

    def _prefill_fn(self, max_len: int):
        return _jitted_prefill(max_len)

    def _prefill_inputs(self, ids: np.ndarray, lengths: np.ndarray):
        """(ids, positions, index of each row's last prompt token), zigzagged on a seq mesh.

        Pads get ``PAD_POSITION`` so that no later token attends to them through the cache."""
        rows, length = ids.shape
        columns = np.broadcast_to(np.arange(length, dtype=np.int32), ids.shape)
        positions = np.where(columns < lengths[:, None], columns, PAD_POSITION).astype(np.int32)
        last = lengths - 1
        if self.seq_size > 1:
            perm = zigzag_permutation(length, self.seq_size)
            ids, positions = ids[:, perm], positions[:, perm]
            last = np.argsort(perm)[last]
        return ids, positions, last.astype(np.int32)

    def _slots_for(self, columns: int) -> tuple[int, str]:
        """(slots of a continuous-batching pool of ``columns`` cache columns, why)."""
        if self.batch_size:
            return self.batch_size, f"--batch-size {self.batch_size}"
        return memory_slots(self.model, columns, memory_bytes=self.memory_bytes)

    def slot_plan(self, lengths: Sequence[int]):
        """The continuous-batching pools that :meth:`generate` would run for prompts of ``lengths``
        (:class:`longrm_jax.evaluation.grm.slot_plan.Pool`, longest bucket first); None for static batches."""
        if not self.continuous:
            return None
        return plan_pools(lengths, self.max_new_tokens, self._slots_for)

    def generate_live(self, source, max_length: int, max_slots: int | None = None, on_pool=None) -> None:
        """Serve the prompts of ``source`` (a :class:`longrm_jax.evaluation.grm.continuous.LiveSource`) as they
        arrive, each a pool's row as soon as a slot is free, until it stops (continuous batching only); a pool has
        the slots memory (or ``batch_size``) allows, at most ``max_slots``."""
        if not self.continuous:
            raise ValueError("live generation needs continuous batching (one device, no --static-batches)")
        def slots_for(columns: int) -> tuple[int, str]:
            slots, why = self._slots_for(columns)
            return (slots, why) if max_slots is None or slots <= max_slots else (max_slots, f"at most {max_slots}")

        generate_live(self, source, slots_for=slots_for, chunk=self.decode_chunk, max_length=max_length,
                      on_pool=on_pool)

    def generate(self, prompts: Sequence[np.ndarray], progress: bool = True, desc: str = "GRM generation",
                 budgets: Sequence[int] | None = None, on_result=None) -> list[Generation]:
        """Greedy continuations of ``prompts`` (int32 id arrays), in the given order.

        ``budgets``: per-prompt token budgets (<= ``max_new_tokens``; continuous batching only), e.g. the
        benchmark's simulated judgement lengths. ``on_result(index, generation)``: called as each prompt
        finishes (in completion order). This call's phase timings: ``self.timings``."""
        self.timings = Timings()
        warn_past_positions(self.model, [len(p) for p in prompts], "prompts are")
        if self.continuous:
            results, self.timings = continuous_generate(self, prompts, slots_for=self._slots_for,
                                                        chunk=self.decode_chunk, progress=progress, desc=desc,
                                                        budgets=budgets, on_result=on_result)
            return results
        if budgets is not None:
            raise ValueError("per-prompt budgets need continuous batching (one device, no --static-batches)")

        row_multiple, _ = mesh_sizes(self.mesh)
        length_multiple = 2 * self.seq_size if self.seq_size > 1 else 1
        batches = plan_batches([len(p) for p in prompts], max_rows=self.batch_size or 4,
                               max_batch_tokens=self.max_batch_tokens, length_multiple=length_multiple,
                               row_multiple=row_multiple, extra_tokens=self.max_new_tokens)
        results: list[Generation | None] = [None] * len(prompts)
        bar = tqdm(total=len(prompts), unit="prompt", desc=desc, disable=not progress)
        for batch in batches:
            ids, lengths = pad_rows(prompts, batch, self.pad_id)
            ids, positions, last = self._prefill_inputs(ids, lengths)
            prefill = self._prefill_fn(batch.length + self.max_new_tokens)
            args = [place_batch(a, self.mesh) for a in (ids, positions, last)]
            if self.mesh is not None:
                with jax.set_mesh(self.mesh):
                    cache, first, first_letters = prefill(self.model, *args, self.letter_ids)
            else:
                cache, first, first_letters = prefill(self.model, *args, self.letter_ids)
            tokens, letters, _, _ = self._decode(self.model, cache, first, first_letters,
                                              place_batch(lengths, self.mesh, ("batch",)), self.stop_ids,
                                              self.letter_ids)
            tokens, letters = np.asarray(jax.device_get(tokens)), np.asarray(jax.device_get(letters))
            stop_set = set(np.asarray(self.stop_ids).tolist())
            for row, item in enumerate(batch.items):
                row_tokens = tokens[row]
                stops = [i for i, t in enumerate(row_tokens.tolist()) if t in stop_set]
                end = stops[0] if stops else len(row_tokens)
                results[item] = Generation(row_tokens[:end].astype(np.int32), letters[row, :end], bool(stops))
                if on_result is not None:
                    on_result(item, results[item])
            bar.update(len(batch.items))
        bar.close()
        return results  # type: ignore[return-value]
