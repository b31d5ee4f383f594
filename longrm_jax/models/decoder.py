"""One NNX decoder for the Llama-3.x, Qwen3, Qwen2, Mistral and Gemma 3 families (its causal-LM and
sequence-classifier heads: ``models.heads``).

Qwen3 differs from Llama only by ``cfg.qk_norm`` (per-head RMSNorm on q and k before RoPE) and an
independent ``head_dim``, Qwen2 by q/k/v biases; Gemma 3 adds sliding-window layers with their own RoPE
(``models.local_layers``), (1 + weight) norms, norms on the attention and MLP outputs, GeGLU, scaled
embeddings and a tanh logit cap: all flags of the same code, not a second model.

Layers are *stacked*: every per-layer weight is one array with a leading ``layers`` axis, and the layer body
(:func:`longrm_jax.models.layers.layer_forward`) runs under ``jax.lax.scan``. XLA then traces and compiles
the body once instead of 32-36 unrolled copies, so compile time and program size stay flat in depth (the
unrolled graph of an 8B model takes minutes to compile; the scanned one seconds). ``scan_layers=False``
unrolls the same body with a Python loop, for debugging. The remat policy wraps the scanned body with
``jax.checkpoint``, so activation memory is one layer's residuals per layer boundary plus what the policy saves.

With a KV cache ([L, B, S, K, H], stacked like the weights) the cache rides in the layer loop's carry: each
layer writes its new rows in place and attends over its own rows of the updated buffer, never over a copy (see
``Decoder.__call__``). What XLA still copies under ``scan`` on GPU is each layer's slice of the stacked weights
before a Triton matmul: for decoding, run with :data:`longrm_jax.xla_flags.GPU_DECODE_XLA_FLAGS`, or set
``ModelConfig.unroll_cached_layers``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from longrm_jax.models.cache import KVCache
from longrm_jax.models.config import ModelConfig
from jax.ad_checkpoint import checkpoint_name

from longrm_jax.models.layers import (LAYER_INPUT_NAME, constrain, device_twin, kernel_mask, layer_forward, norm,
                                      remat_policy, stacked_cache_attention)
from longrm_jax.models.local_layers import by_kind, is_local, layer_rope, pick, rope_of
from longrm_jax.models.window_cache import split_cached_call
from longrm_jax.ops import attention
from longrm_jax.parallel.mesh import logical_to_spec
from longrm_jax.parallel.placement import fit_spec


def layer_param_specs(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...], str]]:
    """Per-layer weights: name -> (shape without the layers axis, logical axis names, init kind)."""
    d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    unit = "zeros" if cfg.norm_unit_offset else "ones"  # a (1 + weight) norm starts at weight 0, as HF's
    specs = {
        "attn_norm": ((d,), ("norm",), unit),
        "q_proj": ((d, n, h), ("embed", "heads", "head_dim"), "normal"),
        "k_proj": ((d, k, h), ("embed", "kv_heads", "head_dim"), "normal"),
        "v_proj": ((d, k, h), ("embed", "kv_heads", "head_dim"), "normal"),
        "o_proj": ((n, h, d), ("heads", "head_dim", "embed"), "normal"),
        "mlp_norm": ((d,), ("norm",), unit),
        "gate_proj": ((d, f), ("embed", "mlp"), "normal"),
        "up_proj": ((d, f), ("embed", "mlp"), "normal"),
        "down_proj": ((f, d), ("mlp", "embed"), "normal"),
    }
    if cfg.qk_norm:
        specs["q_norm"] = ((h,), ("norm",), unit)
        specs["k_norm"] = ((h,), ("norm",), unit)
    if cfg.sandwich_norms:
        specs["post_attn_norm"] = ((d,), ("norm",), unit)
        specs["post_mlp_norm"] = ((d,), ("norm",), unit)
    if cfg.has_qkv_bias:
        specs["q_bias"] = ((n, h), ("heads", "head_dim"), "zeros")
        specs["k_bias"] = ((k, h), ("kv_heads", "head_dim"), "zeros")
        specs["v_bias"] = ((k, h), ("kv_heads", "head_dim"), "zeros")
    if cfg.attention_bias:
        specs["o_bias"] = ((d,), ("embed",), "zeros")
    if cfg.mlp_bias:
        specs["gate_bias"] = ((f,), ("mlp",), "zeros")
        specs["up_bias"] = ((f,), ("mlp",), "zeros")
        specs["down_bias"] = ((d,), ("embed",), "zeros")
    return specs


def make_param(rngs: nnx.Rngs, shape, names, init: str, cfg: ModelConfig) -> nnx.Param:
    dtype = cfg.weights_dtype
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:  # HF's _init_weights: normal(0, initializer_range) for every Linear / Embedding
        value = (cfg.initializer_range * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    # Logical names, mapped to mesh axes by longrm_jax.parallel.mesh; never eagerly sharded at creation
    # (the names are not mesh axes).
    return nnx.Param(value, out_sharding=tuple(names), eager_sharding=False)


def _freeze_rules(rules: Mapping | None):
    return None if rules is None else tuple(sorted(rules.items()))


def default_positions(segment_ids: jax.Array | None, batch: int, length: int) -> jax.Array:
    """arange(T) per row, restarting at 0 wherever the segment id changes (packed rows)."""
    idx = jnp.arange(length, dtype=jnp.int32)
    if segment_ids is None:
        return jnp.broadcast_to(idx, (batch, length))
    starts = jnp.concatenate(
        [jnp.ones((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    start_index = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return idx - start_index


def _like_sharding(array: jax.Array, logical, rules: Mapping | None, shape):
    """Sharding of a new weight of ``shape`` with logical axis names ``logical``, on the mesh ``array`` is
    placed on; None (the default placement) when ``array`` is on one device or being traced."""
    sharding = getattr(array, "sharding", None) if isinstance(array, jax.Array) else None
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    spec = logical_to_spec(logical, rules, sharding.mesh)
    return jax.sharding.NamedSharding(sharding.mesh, fit_spec(spec, shape, sharding.mesh))


class DecoderLayers(nnx.Module):
    """All layers' weights, each stacked along a leading ``layers`` axis."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        for name, (shape, names, init) in layer_param_specs(cfg).items():
            setattr(self, name, make_param(rngs, (cfg.num_layers, *shape), ("layers", *names), init, cfg))
        self.names = tuple(layer_param_specs(cfg))

    def stacked(self) -> dict[str, jax.Array]:
        """Every layer weight by name, plus the LoRA branches attached for a train step (see
        :meth:`attach_lora_branches`)."""
        return {name: getattr(self, name)[...] for name in self.names} | self.__dict__.get("lora_branches", {})

    def attach_lora_branches(self, branches: Mapping[str, jax.Array]) -> None:
        """Run every layer with these LoRA branches (``<weight>/lora_a`` [L, in, r], ``<weight>/lora_b``
        [L, r, out], scaled; ``training.lora.split_layer_branches``). For a model rebuilt inside a jitted train
        step only: the branches are plain arrays, not parameters of the module."""
        unknown = {k.rsplit("/", 1)[0] for k in branches} - set(self.names)
        if unknown:
            raise KeyError(f"LoRA branches for unknown layer weights {sorted(unknown)}")
        self.lora_branches = dict(branches)

    def fuse_projections(self, cfg: ModelConfig, rules: Mapping | None = None) -> None:
        """Switch to the inference layout, in place and once: ``qkv_proj`` [L, D, K, G + 2, H] replaces q/k/v
        and ``gate_up_proj`` [L, D, 2, F] replaces gate/up (see :mod:`longrm_jax.models.layers`), so that a
        decode step runs one matmul for each, reading the weights as stored. The separate weights are
        dropped one group at a time, so memory grows by at most one fused weight while this runs.

        The parameter tree then no longer follows the HF name mapping: for generation and scoring only
        (training, checkpoints and HF export take the unfused model). A no-op when already fused."""
        if "qkv_proj" in self.names:
            return
        layers, d, k, h = cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim
        g = cfg.num_heads // k

        def qkv(q, k_, v):
            return jnp.concatenate([q.reshape(layers, d, k, g, h), k_[:, :, :, None], v[:, :, :, None]], axis=3)

        def gate_up(gate, up):
            return jnp.stack([gate, up], axis=2)

        groups = (("qkv_proj", ("q_proj", "k_proj", "v_proj"), qkv,
                   ("layers", "embed", "kv_heads", None, "head_dim")),
                  ("gate_up_proj", ("gate_proj", "up_proj"), gate_up, ("layers", "embed", None, "mlp")))
        names = list(self.names)
        for fused_name, parts, combine, logical in groups:
            arrays = [getattr(self, name)[...] for name in parts]
            shape = jax.eval_shape(combine, *arrays).shape
            sharding = _like_sharding(arrays[0], logical, None if rules is None else dict(rules), shape)
            value = jax.jit(combine, out_shardings=sharding)(*arrays)
            del arrays
            for name in parts:
                delattr(self, name)
            setattr(self, fused_name, nnx.Param(value, out_sharding=logical, eager_sharding=False))
            names[names.index(parts[0])] = fused_name
            names = [name for name in names if name not in parts]
        self.names = tuple(names)


class Decoder(nnx.Module):
    """Embedding, stacked layers and final norm; returns final-norm hidden states [B, T, D]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, rules: Mapping | None = None):
        self.config = cfg
        self.rules = _freeze_rules(rules)
        self.embed = make_param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), "normal", cfg)
        self.layers = DecoderLayers(cfg, rngs=rngs)
        self.final_norm = make_param(rngs, (cfg.hidden_size,), ("norm",), "zeros" if cfg.norm_unit_offset else "ones",
                                      cfg)

    def _run_layers(self, body, carry, stacked, *, unroll: bool = False):
        """carry = body(carry, layer_params, layer_index) over all layers (scanned, or unrolled when
        ``unroll`` or ``cfg.scan_layers`` is off; unrolled, the layer index is a Python int).

        ``cfg.offloaded_layers`` = K under an offloading policy: layers [0, K) run with it and [K, L) with its
        on-device twin (models.layers.device_twin), as two scans (a scan stacks every layer's saved tensors in
        one memory space)."""
        cfg = self.config
        split = cfg.offloaded_layers
        # Only the differentiated (training) path saves anything; cached calls keep one scan.
        if (split is None or not isinstance(carry, jax.Array) or device_twin(cfg.remat) == cfg.remat
                or split == cfg.num_layers):
            return self._run_layer_range(body, carry, stacked, 0, cfg.num_layers, cfg.remat, unroll)
        if split:
            carry = self._run_layer_range(body, carry, stacked, 0, split, cfg.remat, unroll)
        return self._run_layer_range(body, carry, stacked, split, cfg.num_layers, device_twin(cfg.remat), unroll)

    def _run_layer_range(self, body, carry, stacked, start: int, stop: int, remat: str, unroll: bool):
        """Layers [start, stop) of ``stacked`` (all layers' weights) under the remat policy ``remat``."""
        cfg = self.config
        use_remat, policy = remat_policy(remat)
        whole = (start, stop) == (0, cfg.num_layers) or unroll or not cfg.scan_layers
        if not whole:
            # Part of the stack, scanned over layer indices: each layer indexes the whole stacked weights inside
            # the checkpointed body (a static slice of the stack would be a copy of the weights; an index taken
            # outside the body would make each layer's weights a residual the scan stacks for the backward).
            by_index = body

            def body(x, _, i):
                return by_index(x, jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False),
                                                stacked), i)
        if use_remat and isinstance(carry, jax.Array):
            # The layer input, named on entry so every use inside the layer (its norm and the residual add)
            # reads the named value: an offloading policy then saves that (host) copy as the scan's per-layer
            # residual instead of the raw carry on the device (models.layers.LAYER_INPUT_NAME). The cached
            # path's carry (hidden, cache) is never differentiated and stays unnamed.
            inner = body

            def body(x, p, i):
                return inner(checkpoint_name(x, LAYER_INPUT_NAME), p, i)
        if use_remat:
            body = jax.checkpoint(body, policy=policy, static_argnums=(2,) if unroll or not cfg.scan_layers else ())
        if unroll or not cfg.scan_layers:
            for i in range(start, stop):
                carry = body(carry, jax.tree.map(lambda a, i=i: a[i], stacked), i)
            return carry
        if whole:
            def scan_body(c, xs):
                return body(c, *xs), None

            carry, _ = jax.lax.scan(scan_body, carry, (stacked, jnp.arange(stop, dtype=jnp.int32)))
            return carry

        def range_body(c, i):
            return body(c, None, i), None

        carry, _ = jax.lax.scan(range_body, carry, jnp.arange(start, stop, dtype=jnp.int32))
        return carry

    def fuse_projections(self) -> None:
        """The inference weight layout (one q/k/v and one gate/up matmul): see
        :meth:`DecoderLayers.fuse_projections`."""
        self.layers.fuse_projections(self.config, self.rules)

    def __call__(self, input_ids, positions=None, segment_ids=None, *, cache: KVCache | None = None,
                 prefill: bool = False, write_at: tuple[jax.Array, jax.Array] | None = None):
        """(hidden [B, T, D], updated cache or None). See :meth:`CausalLM.__call__` for the arguments."""
        cfg = self.config
        batch, length = input_ids.shape
        if positions is None:
            positions = default_positions(segment_ids, batch, length)
        x = self._embed(input_ids)
        global_rope, local_rope = layer_rope(cfg, positions, x.dtype)
        stacked = self.layers.stacked()

        def attend_fresh(local, q, k, v):
            """Attention over the call's own tokens with the layer's window (static in each branch)."""
            kwargs = dict(segment_ids=segment_ids, causal=True, scale=cfg.attention_scale, impl=cfg.attention_impl,
                          interpret=cfg.attention_interpret)
            return by_kind(local, functools.partial(attention, window=cfg.sliding_window, **kwargs),
                           functools.partial(attention, **kwargs), q, k, v)

        if cache is None:
            def body(x, p, i):
                local = is_local(cfg, i)

                def attend(q, k, v):
                    return attend_fresh(local, q, k, v), None

                return layer_forward(p, x, *rope_of(local, global_rope, local_rope), cfg, self.rules, attend)[0]

            x = self._run_layers(body, x, stacked)
            return norm(x, self.final_norm[...], cfg), None

        if write_at is not None and not (prefill and batch == 1):
            raise ValueError("write_at places one prompt's prefill (batch 1, prefill=True) into a cache row")
        seg = jnp.ones((batch, length), jnp.int32) if segment_ids is None else segment_ids
        if cache.ring is not None:  # local layers in rings of their window (models.window_cache)
            x, cache = split_cached_call(self, x, cache, positions, seg, (global_rope, local_rope), stacked,
                                         prefill=prefill, write_at=write_at, attend_fresh=attend_fresh)
            return norm(x, self.final_norm[...], cfg), cache
        x, cache = self._stacked_cache_layers(x, cache, positions, seg, (global_rope, local_rope), stacked,
                                              prefill=prefill, write_at=write_at, attend_fresh=attend_fresh)
        return norm(x, self.final_norm[...], cfg), cache

    def _embed(self, input_ids):
        """The token embeddings [B, T, D] in the compute dtype, laid out as activations."""
        cfg = self.config
        batch, length = input_ids.shape
        # A lookup from a table that FSDP splits over its model dim: XLA's SPMD partitioner cannot move the
        # [B, T, D] result to the activations' layout and replicates it on every device (an "involuntary full
        # rematerialization": f32[4, 131072, 4096] for the SimPO TPU config compiled for h100x8x2, fsdp 2).
        # When the batch has more tokens than the table has rows, gathering the table first (as every layer's
        # weights are) moves less; a decode step's few tokens keep the split table. The table stays in the
        # parameter dtype: the lookup's gradient adds up every occurrence of a token.
        table = self.embed[...]
        if batch * length > table.shape[0]:
            table = constrain(table, ("vocab", None), self.rules)
        x = jnp.take(table, input_ids, axis=0).astype(cfg.compute_dtype)
        if cfg.embed_scale:  # Gemma: sqrt(hidden) rounded to the compute dtype, as HF's bf16 runs do
            x = x * jnp.asarray(cfg.hidden_size**0.5, x.dtype)
        return constrain(x, ("batch", "seq", "act_embed"), self.rules)

    def _stacked_cache_layers(self, x, cache: KVCache, positions, seg, ropes, stacked, *, prefill: bool, write_at,
                              attend_fresh):
        """The layers over a stacked (unwindowed) KV cache: (hidden before the final norm, the updated cache)."""
        cfg = self.config
        length = x.shape[1]
        global_rope, local_rope = ropes
        if write_at is None:
            cache = cache.write_meta(positions, seg)
        masks = [cache.attention_mask(positions, seg, length)]  # global layers' [B, T, S], then local ones'
        if any(cfg.local_layers):
            masks.append(cache.attention_mask(positions, seg, length, window=cfg.sliding_window))
        decode_masks = [None if prefill else kernel_mask(m, cfg.decode_attention, cfg.head_dim) for m in masks]
        start = cache.index

        # The stacked cache rides in the carry. Each layer first writes its T new keys / values in place
        # (dynamic_update_slice on the carried buffer) and then attends over its own rows of that same buffer,
        # so a decode step never copies a layer's cache (slicing a layer out and writing into the slice would
        # copy all of its S rows, twice per layer and step). Cached calls that are not a prefill also unroll
        # the layers (``cfg.unroll_cached_layers``): the layer's weights and cache rows are then static slices,
        # which XLA fuses into the matmuls instead of copying them as it does dynamic slices of a scan.
        zero = jnp.zeros((), jnp.int32)

        def cached_body(carry, p, i):
            x, k_all, v_all = carry
            local = is_local(cfg, i)
            mask, decode_mask_bs = pick(local, masks[-1], masks[0]), pick(local, decode_masks[-1], decode_masks[0])

            def attend(q, k, v):
                if write_at is None:
                    at = (i, zero, start, zero, zero)
                    k_new = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), at)
                    v_new = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), at)
                else:  # scattered into one row of a (donated) slot pool, in place
                    row, columns = write_at
                    k_new = k_all.at[i, row, columns].set(k[0].astype(k_all.dtype), unique_indices=True)
                    v_new = v_all.at[i, row, columns].set(v[0].astype(v_all.dtype), unique_indices=True)
                if prefill:  # empty cache: plain (fast-kernel) attention over the new tokens only
                    out = attend_fresh(local, q, k, v)
                else:
                    out = stacked_cache_attention(q, k_new, v_new, i, mask, cfg.decode_attention, decode_mask_bs,
                                                  scale=cfg.attention_scale)
                return out, (k_new, v_new)

            rope = rope_of(local, global_rope, local_rope)
            x, (k_all, v_all) = layer_forward(p, x, *rope, cfg, self.rules, attend)
            return x, k_all, v_all

        unroll = cfg.unroll_cached_layers and not prefill
        x, k_all, v_all = self._run_layers(cached_body, (x, cache.k, cache.v), stacked, unroll=unroll)
        cache = KVCache(k=k_all, v=v_all, positions=cache.positions, segment_ids=cache.segment_ids,
                        index=cache.index + (0 if write_at is not None else length))
        return x, cache
