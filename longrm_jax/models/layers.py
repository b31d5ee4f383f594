"""Pure functions of one decoder layer (Llama / Qwen3 / Qwen2 / Mistral / Gemma 3), on a dict of that layer's
parameter arrays.

Kept free of NNX so the same body runs under ``jax.lax.scan`` over stacked layers, unrolled, and with a KV
cache. Parameter layouts (per layer, i.e. without the leading ``layers`` axis):

  attn_norm, mlp_norm [D]          q_proj [D, N, H]    k_proj, v_proj [D, K, H]    o_proj [N, H, D]
  q_norm, k_norm [H] (Qwen3)       q_bias [N, H], k_bias / v_bias [K, H] (attention_bias or Qwen2's qkv_bias),
                                   o_bias [D] (attention_bias)
  gate_proj, up_proj [D, F]        down_proj [F, D]    gate_bias / up_bias [F], down_bias [D] (mlp_bias)
  post_attn_norm, post_mlp_norm [D] (Gemma 3's sandwich_norms: on the attention and MLP outputs)

Gemma 3 (config flags, see ``ModelConfig``): norms scale by (1 + weight) (``norm_unit_offset``), GeGLU with
tanh GELU (``hidden_act``), attention scale ``query_pre_attn_scalar ** -0.5``.

Inference layout (:meth:`longrm_jax.models.decoder.DecoderLayers.fuse_projections`, used by the evaluator):
q/k/v weights as one ``qkv_proj`` [D, K, G + 2, H] (G = N / K query heads per kv head: kv head k's G query
heads, then its key head, then its value head) and gate/up as one ``gate_up_proj`` [D, 2, F], so that a
decode step runs one matmul where it ran three and two. The layer functions read either layout.

LoRA branches (training with a frozen base, ``training.lora.split_layer_branches``): ``<name>/lora_a`` [in, r]
and ``<name>/lora_b`` [r, out] (already scaled) next to a weight ``<name>`` add ``(x @ A) @ B`` to its output.

Sequence-tiled MLP (``ModelConfig.mlp_chunk_tokens``): the MLP is per token, so it can run on token chunks,
each under its own ``jax.checkpoint``; only one chunk's [chunk, F] intermediates (gate, up, their product and
their gradients) are live at a time instead of [T, F] ones -- at T = 256K tokens and F = 14336 each such
buffer is 7 GiB in bf16.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from longrm_jax.models.config import ModelConfig
from longrm_jax.models.rope import apply_rope
from longrm_jax.ops.contract import ATTENTION_LSE_NAME, ATTENTION_OUT_NAME
from longrm_jax.ops.decode_attention import decode_attention_supported, stacked_cache_decode_attention
from longrm_jax.ops.fp8_matmul import fp8_projection
from longrm_jax.parallel.mesh import logical_to_spec
from longrm_jax.parallel.placement import SEQ_AXIS, fit_spec, on_own_rows


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, unit_offset: bool = False) -> jax.Array:
    """HF order: normalise in float32, cast back to the input dtype, then multiply by the weight.
    ``unit_offset`` (Gemma): multiply by (1 + weight) in float32 and cast last, as Gemma3RMSNorm does."""
    if unit_offset:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
        return (x32 * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
    return weight.astype(x.dtype) * rms_normalize(x, eps)


def norm(x: jax.Array, weight: jax.Array, cfg: ModelConfig) -> jax.Array:
    """The family's RMSNorm (:func:`rms_norm` with ``cfg``'s epsilon and offset)."""
    return rms_norm(x, weight, cfg.rms_norm_eps, cfg.norm_unit_offset)


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """:func:`rms_norm` before the weight: x / rms(x) in float32, cast back to x's dtype."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return x32.astype(x.dtype)


def constrain(x: jax.Array, names: tuple[str | None, ...], rules) -> jax.Array:
    """Sharding constraint by logical names when a mesh is set (``jax.set_mesh``); a no-op otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or not mesh.axis_names:
        return x
    spec = logical_to_spec(names, dict(rules) if rules is not None else None, mesh)
    if mesh.manual_axes:  # inside a shard_map: its manual axes split the array already
        spec = P(*(_without(entry, mesh.manual_axes) for entry in spec))
    # A dimension its mesh axes do not divide (e.g. batch 1 while decoding on an fsdp mesh) stays replicated
    # instead of failing.
    return jax.lax.with_sharding_constraint(x, fit_spec(spec, x.shape, mesh))


def _without(entry, axes):
    """A spec entry without the mesh axes ``axes``."""
    kept = tuple(a for a in ((entry,) if isinstance(entry, str) else entry or ()) if a not in axes)
    return kept[0] if len(kept) == 1 else (kept or None)


def _cast(p: dict, dtype) -> dict:
    return {name: w.astype(dtype) for name, w in p.items()}


def project(spec: str, x: jax.Array, w: jax.Array, cfg: ModelConfig) -> jax.Array:
    """A weight's projection ``jnp.einsum(spec, x, w)``, where ``w`` contracts ``x``'s trailing axes with its
    leading ones; under ``cfg.matmul_dtype`` "fp8" or "fp8_forward" the same contraction in FP8
    (``ops.fp8_matmul``)."""
    if cfg.matmul_dtype != "compute":
        contracted = len(set(spec.split(",")[0]) & set(spec.split(",")[1].split("->")[0]))
        return fp8_projection(x, w, contracted, cfg.matmul_dtype)
    return jnp.einsum(spec, x, w)


def with_lora(p: dict, name: str, x: jax.Array, in_axes: int, out: jax.Array) -> jax.Array:
    """``out`` (x @ p[name], any layout) plus the LoRA branch ``(x @ A) @ B`` of weight ``name`` when ``p``
    holds one; ``in_axes``: trailing axes of ``x`` that the weight contracts."""
    a = p.get(name + "/lora_a")
    if a is None:
        return out
    lead = x.shape[: x.ndim - in_axes]
    low = x.reshape(*lead, -1) @ a
    return out + (low @ p[name + "/lora_b"]).reshape(out.shape)


def qkv_projection(p: dict, h_btd: jax.Array, cos, sin, cfg: ModelConfig):
    """q [B,T,N,H], k, v [B,T,K,H] with Qwen3's per-head q/k norm (before RoPE) and RoPE applied."""
    if "qkv_proj" in p:
        return _fused_qkv_projection(p, h_btd, cos, sin, cfg)
    q = with_lora(p, "q_proj", h_btd, 1, project("btd,dnh->btnh", h_btd, p["q_proj"], cfg))
    k = with_lora(p, "k_proj", h_btd, 1, project("btd,dkh->btkh", h_btd, p["k_proj"], cfg))
    v = with_lora(p, "v_proj", h_btd, 1, project("btd,dkh->btkh", h_btd, p["v_proj"], cfg))
    if cfg.has_qkv_bias:
        q, k, v = q + p["q_bias"], k + p["k_bias"], v + p["v_bias"]
    if cfg.qk_norm:
        q, k = norm(q, p["q_norm"], cfg), norm(k, p["k_norm"], cfg)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _fused_qkv_projection(p: dict, h_btd: jax.Array, cos, sin, cfg: ModelConfig):
    """:func:`qkv_projection` on the fused ``qkv_proj`` [D, K, G + 2, H]: one matmul, and Qwen3's q and k
    norms as one per-head normalisation of the whole matmul output (the value heads' share is computed and
    dropped: normalising a slice would cost XLA a separate copy kernel), each weight applied after the split
    (the same arithmetic as :func:`rms_norm` per head)."""
    b, t, _ = h_btd.shape
    g = cfg.num_heads // cfg.num_kv_heads
    qkv = project("btd,dkgh->btkgh", h_btd, p["qkv_proj"], cfg)  # [B, T, K, G + 2, H]
    if cfg.has_qkv_bias:
        qkv = qkv + jnp.concatenate([p["q_bias"].reshape(cfg.num_kv_heads, g, cfg.head_dim),
                                     p["k_bias"][:, None], p["v_bias"][:, None]], axis=1)
    v = qkv[:, :, :, g + 1]
    if cfg.qk_norm and cfg.norm_unit_offset:  # Gemma's norm multiplies in float32: per slice
        q, k = norm(qkv[:, :, :, :g], p["q_norm"], cfg), norm(qkv[:, :, :, g], p["k_norm"], cfg)
    elif cfg.qk_norm:
        normed = rms_normalize(qkv, cfg.rms_norm_eps)
        q = p["q_norm"].astype(qkv.dtype) * normed[:, :, :, :g]
        k = p["k_norm"].astype(qkv.dtype) * normed[:, :, :, g]
    else:
        q, k = qkv[:, :, :, :g], qkv[:, :, :, g]
    q = q.reshape(b, t, cfg.num_heads, cfg.head_dim)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def mlp(p: dict, h_btd: jax.Array, cfg: ModelConfig, rules) -> jax.Array:
    """The MLP, sequence-tiled when ``cfg.mlp_chunk_tokens`` is set and smaller than the row (see the module
    docstring)."""
    chunk = cfg.mlp_chunk_tokens
    if not (chunk and h_btd.shape[1] > chunk):
        return _mlp(p, h_btd, cfg, rules)
    names = [k for k in p if k.split("/", 1)[0] in MLP_WEIGHTS]

    def own_tokens(h, *weights):
        # A device's own share of the tokens keeps the chunk count: chunks of chunk / seq tokens each.
        local_chunk = max(1, chunk * h.shape[1] // h_btd.shape[1])
        return tiled_mlp(dict(zip(names, weights)), h, cfg, rules, local_chunk)

    # Each device walks the chunks of its own rows and tokens (parallel.placement.on_own_rows): the weights
    # are gathered once per layer and their gradients summed once. Left to the partitioner, a loop over chunks
    # that span every device gathers the weights and reduces their gradients in every chunk.
    return on_own_rows(own_tokens, (h_btd,), [p[k] for k in names], tokens_over=SEQ_AXIS)


def _mlp(p: dict, h_btd: jax.Array, cfg: ModelConfig, rules) -> jax.Array:
    if "gate_up_proj" in p:  # fused inference layout [D, 2, F]: one matmul
        gate_up = project("btd,dcf->btcf", h_btd, p["gate_up_proj"], cfg)
        gate, up = gate_up[:, :, 0], gate_up[:, :, 1]
    else:
        gate = with_lora(p, "gate_proj", h_btd, 1, project("btd,df->btf", h_btd, p["gate_proj"], cfg))
        up = with_lora(p, "up_proj", h_btd, 1, project("btd,df->btf", h_btd, p["up_proj"], cfg))
    if cfg.mlp_bias:
        gate, up = gate + p["gate_bias"], up + p["up_bias"]
    # Gemma 3's gelu_pytorch_tanh is the tanh approximation of GELU.
    gated = jax.nn.gelu(gate, approximate=True) if cfg.hidden_act == "gelu_pytorch_tanh" else jax.nn.silu(gate)
    act = constrain(gated * up, ("batch", "seq", "act_mlp"), rules)
    out = with_lora(p, "down_proj", act, 1, project("btf,fd->btd", act, p["down_proj"], cfg))
    return out + p["down_bias"] if cfg.mlp_bias else out


MLP_WEIGHTS = ("gate_proj", "up_proj", "gate_up_proj", "down_proj", "gate_bias", "up_bias", "down_bias")


def tiled_mlp(p: dict, h_btd: jax.Array, cfg: ModelConfig, rules, chunk: int) -> jax.Array:
    """:func:`_mlp` over token chunks of at most ``chunk`` tokens, exact (the MLP is per token).

    The T tokens are split into ``n = ceil(T / chunk)`` strided chunks (chunk i holds tokens i, i + n, ...);
    on a mesh :func:`mlp` calls it on each device's own tokens. Each chunk runs
    under ``jax.checkpoint`` inside a ``lax.scan``: the scan keeps only the chunk index per step, and the
    backward recomputes one chunk's gate / up at a time. The MLP's weights enter each chunk in their stored
    dtype and are cast there, so weight gradients (full fine-tuning) accumulate over chunks in that dtype
    (fp32 masters: fp32) rather than in the compute dtype."""
    b, t, d = h_btd.shape
    n = -(-t // chunk)
    pad = n * chunk - t
    h = jnp.pad(h_btd, ((0, 0), (0, pad), (0, 0))) if pad else h_btd
    h = h.reshape(b, chunk, n, d)  # token j * n + i -> [:, j, i]
    weights = {k: v for k, v in p.items() if k.split("/", 1)[0] in MLP_WEIGHTS}

    @jax.checkpoint
    def one(w, tokens, i):
        x = jax.lax.dynamic_index_in_dim(tokens, i, axis=2, keepdims=False)  # [B, chunk, D]
        return _mlp(_cast(w, h_btd.dtype), x, cfg, rules)

    def body(_, i):
        return None, one(weights, h, i)

    _, out = jax.lax.scan(body, None, jnp.arange(n, dtype=jnp.int32))  # [n, B, chunk, D]
    out = jnp.transpose(out, (1, 2, 0, 3)).reshape(b, n * chunk, d)
    return out[:, :t] if pad else out


def output_projection(p: dict, attn_btnh: jax.Array, cfg: ModelConfig) -> jax.Array:
    out = with_lora(p, "o_proj", attn_btnh, 2, project("btnh,nhd->btd", attn_btnh, p["o_proj"], cfg))
    return out + p["o_bias"] if cfg.attention_bias else out


def layer_forward(p, x_btd, cos, sin, cfg: ModelConfig, rules, attend):
    """One pre-norm decoder layer. ``attend(q, k, v)`` -> [B,T,N,H] does the attention (plain or cached) and
    may return extra outputs: it returns (out, aux) and aux is passed through."""
    stored, p = p, _cast(p, x_btd.dtype)
    h = norm(x_btd, p["attn_norm"], cfg)
    q, k, v = qkv_projection(p, h, cos, sin, cfg)
    attn, aux = attend(q, k, v)
    out = output_projection(p, attn, cfg)
    if cfg.sandwich_norms:
        out = norm(out, p["post_attn_norm"], cfg)
    x = constrain(x_btd + out, ("batch", "seq", "act_embed"), rules)
    h = norm(x, p["mlp_norm"], cfg)
    # The tiled MLP casts its weights per chunk (see tiled_mlp); the plain one takes the cast copies.
    tiled = cfg.mlp_chunk_tokens and h.shape[1] > cfg.mlp_chunk_tokens
    out = mlp(stored if tiled else p, h, cfg, rules)
    if cfg.sandwich_norms:
        out = norm(out, p["post_mlp_norm"], cfg)
    x = constrain(x + out, ("batch", "seq", "act_embed"), rules)
    return x, aux


def masked_attention(q_btnh, k_bskh, v_bskh, mask_bts, scale=None):
    """Plain XLA attention with an explicit boolean mask [B, T, S] (used with the KV cache, where query and
    key positions differ). Scores and softmax in float32; output in q's dtype."""
    b, t, n, h = q_btnh.shape
    kv = k_bskh.shape[2]
    scale = h**-0.5 if scale is None else scale
    qg = q_btnh.reshape(b, t, kv, n // kv, h)
    if t == 1:
        return _single_query_attention(qg[:, 0], k_bskh, v_bskh, mask_bts[:, 0], scale).reshape(b, 1, n, h).astype(
            q_btnh.dtype)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k_bskh, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask_bts[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_bskh.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v_bskh)
    return out.reshape(b, t, n, h).astype(q_btnh.dtype)


def uses_decode_kernel(impl: str, new_tokens: int, head_dim: int, slots: int) -> bool:
    """Whether :func:`stacked_cache_attention` runs the decode kernel for these shapes."""
    return impl != "xla" and new_tokens == 1 and decode_attention_supported(head_dim, slots)


def kernel_mask(mask_bts: jax.Array, impl: str, head_dim: int) -> jax.Array | None:
    """The decode kernel's mask (int32 [B, S]) for :func:`stacked_cache_attention`, built once per step before
    the layer loop: XLA does not hoist the bool -> int32 conversion out of it (None where the kernel does not
    run)."""
    _, t, slots = mask_bts.shape
    return mask_bts[:, 0].astype(jnp.int32) if uses_decode_kernel(impl, t, head_dim, slots) else None


def stacked_cache_attention(q_btnh, k_all, v_all, layer, mask_bts, impl: str = "xla", kernel_mask_bs=None,
                            scale=None):
    """:func:`masked_attention` of the T new queries over layer ``layer`` of the stacked cache ``[L, B, S, K,
    H]``. A decode step (T = 1) with ``impl`` ``pallas`` runs the Triton kernel on the whole stacked buffer (no
    copy of the layer's rows; ``ops.decode_attention``), masked by ``kernel_mask_bs`` (:func:`kernel_mask`)
    when given; everything else attends over ``k_all[layer]``."""
    b, t, n, h = q_btnh.shape
    kv, slots = k_all.shape[3], k_all.shape[2]
    if uses_decode_kernel(impl, t, h, slots):
        mask = kernel_mask_bs if kernel_mask_bs is not None else mask_bts[:, 0]
        out = stacked_cache_decode_attention(q_btnh.reshape(b, kv, n // kv, h), k_all, v_all, layer, mask,
                                             scale=h**-0.5 if scale is None else scale,
                                             interpret=impl == "pallas_interpret",
                                             out_dtype=q_btnh.dtype)
        return out.reshape(b, 1, n, h)
    return masked_attention(q_btnh, k_all[layer], v_all[layer], mask_bts, scale)


# Chunks of the cache's S axis that the decode attention's value sum is split into (a hand-made split-K): cuBLAS
# runs the [G, S] x [S, H] product of each kv head with only B x K output tiles, too few blocks to stream a 32K
# cache at full speed; C chunks give C times as many, and the C partial sums are added afterwards.
_DECODE_VALUE_SPLITS = 16


def _single_query_attention(q_bkgh, k_bskh, v_bskh, mask_bs, scale):
    """One query per row (a decode step) over the cache: [B, K, G, H] float32.

    Two batched matmuls (cuBLAS) that read each layer's keys and values in place, with the value product split
    into ``_DECODE_VALUE_SPLITS`` chunks of the cache: its B x K output tiles are too few blocks for a long
    reduction. Over a stacked Qwen3-8B cache of 32,768 slots (36 layers, decode XLA flags) that is 4.4 ms per
    token at batch 1 against 5.2 ms unsplit and 12.5 ms as a multiply + reduce (XLA reduction fusions at
    ~0.39 TB/s); batch 8: 40, 51 and 102 ms (docs/perf_eval.md, "Decode on an H200"). Scores and softmax in
    float32; the probabilities enter the value product in the cache's dtype with float32 accumulation (as HF's
    attention does).
    """
    f32 = jnp.float32
    b, s, k, h = k_bskh.shape
    g = q_bkgh.shape[2]
    scores = jnp.einsum("bkgh,bskh->bkgs", q_bkgh.astype(k_bskh.dtype), k_bskh, preferred_element_type=f32) * scale
    scores = jnp.where(mask_bs[:, None, None, :], scores, jnp.finfo(f32).min)
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))  # masked slots: exactly 0
    splits = math.gcd(s, _DECODE_VALUE_SPLITS)  # the constant's largest divisor that also divides S
    chunks = weights.astype(v_bskh.dtype).reshape(b, k, g, splits, s // splits)
    out = jnp.einsum("bkgcs,bcskh->bckgh", chunks, v_bskh.reshape(b, splits, s // splits, k, h),
                     preferred_element_type=f32).sum(axis=1)
    return out / jnp.sum(weights, axis=-1)[..., None]


# Remat policy ``save_attention_out``: keep the attention kernel's two forward outputs (output and LSE, named by
# ``ops.flash`` inside its custom VJP's forward rule) and recompute everything else, q/k/v included.
# Why names and not primitives: the kernels' own outputs are all the backward needs, but matching kernel
# primitives (tokamax's ``mpmd_map``, its custom_vjp) also keeps tokamax's internal residuals: the step's XLA
# temp allocation for Qwen3-8B at 2 x 32K tokens is 78.8 GiB that way, 61.7 GiB with the names
# (docs/perf_training.md, "The one-GPU Bradley-Terry step").
# Cost: one [T, N*H] bf16 output plus [N, T] fp32 per layer (19 GB over 36 layers at 64K tokens, Qwen3-8B).
# Ring attention names its per-device out and LSE alike; ``xla`` has no names and simply recomputes, as ``full``.
save_attention_policy = jax.checkpoint_policies.save_only_these_names(ATTENTION_OUT_NAME, ATTENTION_LSE_NAME)


# Name of each decoder layer's input (the residual stream entering the layer) inside the remat'd layer body.
# Under ``jax.checkpoint`` in ``lax.scan`` the body's inputs are what the scan stacks per layer for the backward
# (one [B, T, D] per layer: 1 GiB per layer per 128K tokens at D = 4096 in bf16). ``Decoder._run_layers`` routes
# every use of the layer input through this name, so a policy that offloads the name turns that stacked residual
# into the offloaded copy: the backward's recompute reads the named value, never the raw input.
LAYER_INPUT_NAME = "decoder_layer_input"

# Where the offloading policies put what they save: page-locked host memory, which the GPU reads and writes
# with asynchronous DMA (XLA schedules the copies to overlap the layers' compute).
OFFLOAD_SRC, OFFLOAD_DST = "device", "pinned_host"


def offload_policy(*names: str):
    """Remat policy that saves exactly ``names`` to pinned host memory and recomputes everything else."""
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(names),
        offload_src=OFFLOAD_SRC, offload_dst=OFFLOAD_DST)


# ``offload_layer_inputs``: like ``full`` (one saved tensor per layer, the layer input) but that tensor lives on
# the host, so device activation memory does not grow with depth x length.
offload_layer_inputs_policy = offload_policy(LAYER_INPUT_NAME)
# ``offload_layer_inputs_and_attention``: also the attention kernel's out and LSE (as ``save_attention_out``,
# but on the host): no attention forward in the backward, twice the host memory and PCIe traffic.
offload_layer_inputs_and_attention_policy = offload_policy(LAYER_INPUT_NAME, ATTENTION_OUT_NAME, ATTENTION_LSE_NAME)

def device_twin(name: str) -> str:
    """The on-device policy that saves what the offloading policy ``name`` offloads (ModelConfig.offloaded_layers:
    the layers past the offloaded ones); other policies are their own twin."""
    return {"offload_layer_inputs": "full", "offload_layer_inputs_and_attention": "save_attention_out"}.get(name, name)


def remat_policy(name: str):
    """(apply_checkpoint, policy) for ``ModelConfig.remat``."""
    if name == "none":
        return False, None
    if name == "full":
        return True, None
    if name == "dots_saveable":
        return True, jax.checkpoint_policies.dots_saveable
    if name == "save_attention_out":
        return True, save_attention_policy
    if name == "offload_layer_inputs":
        return True, offload_layer_inputs_policy
    if name == "offload_layer_inputs_and_attention":
        return True, offload_layer_inputs_and_attention_policy
    raise ValueError(f"unknown remat policy {name!r}")
