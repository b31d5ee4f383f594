"""Model configuration and its translation from / to Hugging Face ``config.json``.

``ModelConfig`` is a frozen, hashable dataclass: it is stored on NNX modules as a static attribute, so it
must hash (jit caches key on it). The RoPE scaling dictionary is therefore stored as a sorted tuple of
items; :attr:`ModelConfig.rope_scaling_dict` gives it back as a dict.

transformers 4.x keeps RoPE settings in ``rope_theta`` + ``rope_scaling``; 5.x in ``rope_parameters``
(``rope_type``, ``rope_theta`` and the scaling keys in one dict). We read both and write both, because a
4.x reader that finds no ``rope_theta`` silently falls back to theta 10000.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from longrm_jax.models.gemma3_config import gemma3_fields, gemma3_hf_config, text_base

FAMILY_CLASS_PREFIX = {"llama": "Llama", "qwen3": "Qwen3", "qwen2": "Qwen2", "mistral": "Mistral",
                       "gemma3": "Gemma3"}
HEAD_CLASS_SUFFIX = {"causal_lm": "ForCausalLM", "classifier": "ForSequenceClassification"}
# HF architecture name -> (family, head kind): every family's ...ForCausalLM and ...ForSequenceClassification;
# for Gemma 3 also the language model of the multimodal checkpoints (4B-27B; the vision tower is skipped) and the
# score head transformers puts on its text decoder.
SUPPORTED_ARCHITECTURES: dict[str, tuple[str, str]] = {
    **{prefix + suffix: (family, head) for family, prefix in FAMILY_CLASS_PREFIX.items()
       for head, suffix in HEAD_CLASS_SUFFIX.items()},
    "Gemma3ForConditionalGeneration": ("gemma3", "causal_lm"),
    "Gemma3TextForSequenceClassification": ("gemma3", "classifier"),
}
# MistralConfig's default window, which transformers applies when config.json has no 'sliding_window' key.
MISTRAL_DEFAULT_SLIDING_WINDOW = 4096
LAYER_TYPES = ("full_attention", "sliding_attention")
HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
DECODE_ATTENTION_IMPLS = ("xla", "pallas", "pallas_interpret")
# ModelConfig.matmul_dtype: the weights' projections in the compute dtype, in FP8 both ways, or in FP8 forward
# only (ops.fp8_matmul).
MATMUL_DTYPES = ("compute", "fp8", "fp8_forward")
REMAT_POLICIES = ("none", "full", "dots_saveable", "save_attention_out", "offload_layer_inputs",
                  "offload_layer_inputs_and_attention")
HEADS = ("causal_lm", "classifier")

# Keys of a RoPE parameter dict that are not scaling parameters.
_ROPE_META_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture and numerics of one decoder (Llama-3.x, Qwen3, Qwen2 / Qwen2.5 or Mistral family).

    Attributes mirror HF names where they exist. ``rope_scaling`` holds the scaling parameters (``factor``,
    ``original_max_position_embeddings``, ``low_freq_factor``, ``beta_fast`` ...) without ``rope_type`` /
    ``rope_theta``; pass a dict, it is frozen into sorted items.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    family: str = "llama"  # one of FAMILY_CLASS_PREFIX
    head: str = "causal_lm"  # "causal_lm" | "classifier"
    num_labels: int = 1
    rms_norm_eps: float = 1e-5
    rope_type: str = "default"
    rope_theta: float = 10000.0
    rope_scaling: Any = ()  # dict in, tuple of sorted (key, value) items stored
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    attention_bias: bool = False  # Llama's flag: biases on q, k, v and o
    qkv_bias: bool = False  # Qwen2: biases on q, k and v only (o_proj has none)
    mlp_bias: bool = False
    # Sliding-window attention: layers of type "sliding_attention" in ``layer_types`` (one per layer; () = all
    # full) see only the ``sliding_window`` latest keys up to themselves (HF: i - W < j <= i).
    sliding_window: int | None = None
    layer_types: tuple = ()
    # RoPE theta of the sliding layers (default RoPE; Gemma 3's rope_local_base_freq). None: the global RoPE.
    local_rope_theta: float | None = None
    # Gemma 3 (models.layers): the MLP's activation; RMSNorm scaling by (1 + weight) in fp32 before the cast;
    # norms on the attention and MLP outputs too (four per layer); embeddings times sqrt(hidden) in the compute
    # dtype; attention scale query_pre_attn_scalar ** -0.5 (None: head_dim ** -0.5); tanh softcap of the logits.
    hidden_act: str = "silu"
    norm_unit_offset: bool = False
    sandwich_norms: bool = False
    embed_scale: bool = False
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: Any = None  # int, tuple of ints, or None
    initializer_range: float = 0.02
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"
    # "compute": the weights' projections run in ``dtype``; "fp8": in FP8 with current scaling, e4m3 forward and
    # e5m2 gradients; "fp8_forward": the forward in FP8, the gradients in ``dtype`` (ops.fp8_matmul). Attention,
    # norms and heads stay in ``dtype``.
    matmul_dtype: str = "compute"
    remat: str = "none"  # one of REMAT_POLICIES
    # Run each layer's MLP on token chunks of at most this many tokens (0: whole rows), each chunk recomputed in
    # the backward on its own (models.layers.tiled_mlp): bounds the [tokens, intermediate_size] buffers of
    # long rows. Exact; costs one more MLP forward per layer in the backward under remat "none".
    mlp_chunk_tokens: int = 0
    # Under an offloading remat policy (offload_layer_inputs*): how many layers, the first ones, save to pinned
    # host memory; the others keep what they save on the device (``full`` / ``save_attention_out``). None: all.
    # For steps whose offloaded activations outgrow the host while the device has room (an 8B 2 x 256K LoRA pair:
    # 128 GiB of layer inputs, as much as a 128 GiB host has). Ignored by the other policies.
    offloaded_layers: int | None = None
    scan_layers: bool = True
    # Cached calls other than a prefill (decode steps, suffix chunks) unroll the layer loop when set: each layer's
    # weights are then static slices that XLA's Triton matmuls read in place, where under ``scan`` XLA (GPU)
    # copies each layer's dynamic slice of the stacked weights every step (3x the weight bytes of a decode step,
    # unless XLA_FLAGS has --xla_gpu_enable_dynamic_slice_fusion=true --xla_gpu_enable_triton_gemm=false).
    # Off by default: with XLA's Triton matmuls the unrolled decode program compiled (and autotuned) every layer
    # separately, minutes at 8B. With cuBLAS (the decode flags) it compiles ~8 s longer than the scanned one and
    # runs ~5% faster at batch 1: evaluation.grm.generation.prepare_for_decoding turns it on with the decode kernel,
    # and the evaluator when the run is long enough to pay (evaluation.runner.unroll_decode_layers).
    unroll_cached_layers: bool = False
    attention_impl: str = "auto"
    # Attention of a decode step (one new token per row) over the KV cache: ``xla`` (two batched matmuls, any
    # backend and mesh) or ``pallas`` (ops.decode_attention: a Triton kernel reading the stacked cache in place;
    # one GPU, unsharded cache). The evaluator picks ``pallas`` on a single GPU
    # (evaluation.grm.generation.prepare_for_decoding). ``pallas_interpret``: the kernel in the Pallas interpreter.
    decode_attention: str = "xla"
    # Run ``attention_impl="splash"`` (TPU kernels) in the Pallas interpreter: tests of the TPU path on a CPU.
    attention_interpret: bool = False

    def __post_init__(self):
        scaling = self.rope_scaling
        if isinstance(scaling, Mapping):
            scaling = tuple(sorted((k, _freeze(v)) for k, v in scaling.items() if k not in _ROPE_META_KEYS))
        object.__setattr__(self, "rope_scaling", tuple(scaling or ()))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        object.__setattr__(self, "layer_types", tuple(self.layer_types or ()))
        self._check_layer_types()
        object.__setattr__(self, "dtype", jnp.dtype(self.dtype).name)
        object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype).name)
        if self.family not in FAMILY_CLASS_PREFIX:
            raise ValueError(f"unknown model family {self.family!r}; supported: {sorted(FAMILY_CLASS_PREFIX)}")
        if self.head not in HEADS:
            raise ValueError(f"unknown head {self.head!r}; supported: {list(HEADS)}")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unknown RoPE type {self.rope_type!r}; supported: {list(SUPPORTED_ROPE_TYPES)}")
        if self.decode_attention not in DECODE_ATTENTION_IMPLS:
            raise ValueError(f"unknown decode_attention {self.decode_attention!r}; supported: "
                             f"{list(DECODE_ATTENTION_IMPLS)}")
        if self.matmul_dtype not in MATMUL_DTYPES:
            raise ValueError(f"unknown matmul_dtype {self.matmul_dtype!r}; supported: {list(MATMUL_DTYPES)}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat policy {self.remat!r}; supported: {list(REMAT_POLICIES)}")
        if self.offloaded_layers is not None and not 0 <= self.offloaded_layers <= self.num_layers:
            raise ValueError(f"offloaded_layers must be in [0, num_layers={self.num_layers}] (or None: all), "
                             f"got {self.offloaded_layers}")
        if self.mlp_chunk_tokens < 0:
            raise ValueError(f"mlp_chunk_tokens must be >= 0 (0: untiled), got {self.mlp_chunk_tokens}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def _check_layer_types(self):
        if self.hidden_act not in HIDDEN_ACTS:
            raise ValueError(f"unknown hidden_act {self.hidden_act!r}; supported: {list(HIDDEN_ACTS)}")
        if not self.layer_types:
            return
        if len(self.layer_types) != self.num_layers or set(self.layer_types) - set(LAYER_TYPES):
            raise ValueError(f"layer_types must hold one of {list(LAYER_TYPES)} per layer ({self.num_layers}), "
                             f"got {list(self.layer_types)}")
        if "sliding_attention" in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
            raise ValueError(f"sliding_attention layers need sliding_window >= 1, got {self.sliding_window}")

    @property
    def has_qkv_bias(self) -> bool:
        return self.attention_bias or self.qkv_bias

    @property
    def local_layers(self) -> tuple[bool, ...]:
        """Per layer: whether it attends through the sliding window."""
        return tuple(t == "sliding_attention" for t in self.layer_types) or (False,) * self.num_layers

    @property
    def attention_scale(self) -> float | None:
        """Gemma's query_pre_attn_scalar ** -0.5; None: the kernels' default head_dim ** -0.5."""
        pre = self.query_pre_attn_scalar
        return None if pre is None else float(pre) ** -0.5

    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return {k: _thaw(v) for k, v in self.rope_scaling}

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def weights_dtype(self):
        return jnp.dtype(self.param_dtype)

    @property
    def hf_architecture(self) -> str:
        if self.family == "gemma3" and self.head == "classifier":
            return "Gemma3TextForSequenceClassification"  # the text-only one (we export no vision tower)
        return FAMILY_CLASS_PREFIX[self.family] + HEAD_CLASS_SUFFIX[self.head]

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def _freeze(v):
    return tuple(v) if isinstance(v, list) else v


def _thaw(v):
    return list(v) if isinstance(v, tuple) else v


def _rope_from_hf(hf: Mapping[str, Any]) -> tuple[str, float, dict[str, Any]]:
    """(rope_type, rope_theta, scaling params) from a 4.x or 5.x config dict."""
    params = hf.get("rope_parameters")
    # 5.x may nest per layer type ({"full_attention": {...}}); Llama / Qwen3 use one global dict.
    if isinstance(params, Mapping) and params and all(isinstance(v, Mapping) for v in params.values()):
        kinds = {k: v for k, v in params.items()}
        if len(kinds) != 1:
            raise ValueError(f"per-layer-type rope_parameters are not supported: keys {sorted(kinds)}")
        params = next(iter(kinds.values()))
    if not params:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    else:
        params = dict(params)
        if "rope_theta" not in params:
            params["rope_theta"] = hf.get("rope_theta", 10000.0)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unknown RoPE type {rope_type!r} in config key 'rope_parameters'/'rope_scaling'; "
            f"supported: {list(SUPPORTED_ROPE_TYPES)}"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor={params['partial_rotary_factor']} is not supported (only 1.0)")
    scaling = {k: v for k, v in params.items() if k not in _ROPE_META_KEYS}
    if rope_type in ("llama3", "yarn"):
        # transformers fills this in from max_position_embeddings when absent (standardize_rope_params).
        scaling.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    required = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "yarn": ("factor",)}
    for key in required.get(rope_type, ()):
        if scaling.get(key) is None:
            raise ValueError(f"RoPE type {rope_type!r} needs key {key!r} in 'rope_parameters'/'rope_scaling'")
    return rope_type, float(params["rope_theta"]), scaling


def _window_fields(hf: Mapping[str, Any], family: str, num_layers: int) -> dict:
    """``sliding_window`` and ``layer_types`` as transformers derives them: Qwen2 / Qwen3 with
    ``use_sliding_window``: the layers from ``max_window_layers`` on (or as ``layer_types`` lists them); Mistral:
    every layer unless ``sliding_window`` is null (an absent key is MistralConfig's default, 4096)."""
    if family in ("qwen2", "qwen3") and hf.get("use_sliding_window") and hf.get("sliding_window") is not None:
        start = int(hf.get("max_window_layers", num_layers))
        types = hf.get("layer_types") or ["sliding_attention" if i >= start else "full_attention"
                                          for i in range(num_layers)]
        return dict(sliding_window=int(hf["sliding_window"]), layer_types=tuple(types))
    if family == "mistral":
        window = hf["sliding_window"] if "sliding_window" in hf else MISTRAL_DEFAULT_SLIDING_WINDOW
        if window is not None:
            return dict(sliding_window=int(window), layer_types=("sliding_attention",) * num_layers)
    if family == "llama" and hf.get("use_sliding_window"):
        raise ValueError("config key 'use_sliding_window' is true; Llama has no sliding-window attention")
    return {}


def _family_and_head(hf: Mapping[str, Any]) -> tuple[str, str]:
    """(family, head kind) from ``architectures[0]``, else (family of ``model_type``, "causal_lm")."""
    archs = list(hf.get("architectures") or [])
    if archs:
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unknown architecture {arch!r} in config key 'architectures'; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        return SUPPORTED_ARCHITECTURES[arch]
    model_type = {"gemma3_text": "gemma3"}.get(hf.get("model_type"), hf.get("model_type"))
    if model_type not in FAMILY_CLASS_PREFIX:
        raise ValueError(
            f"config has no 'architectures' and unknown 'model_type' {model_type!r}; "
            f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    return model_type, "causal_lm"


def from_hf_config(hf: Mapping[str, Any], *, head: str | None = None, **overrides) -> ModelConfig:
    """``ModelConfig`` from a parsed HF ``config.json`` dict.

    ``architectures[0]`` picks the family and head (``model_type`` is the fallback for the family);
    ``head`` overrides the head kind (e.g. load a causal-LM checkpoint as a classifier). ``overrides`` set
    any ``ModelConfig`` field (``dtype``, ``param_dtype``, ``remat`` ...).
    """
    family, arch_head = _family_and_head(hf)
    head = head or arch_head
    if family == "gemma3":
        hf, gemma = gemma3_fields(hf)
        rope_type, rope_theta, scaling = _rope_from_hf(gemma.pop("global_rope"))
    else:
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config key 'hidden_act' is {act!r}; only 'silu' is supported")
        rope_type, rope_theta, scaling = _rope_from_hf(hf)
        gemma = _window_fields(hf, family, int(hf["num_hidden_layers"]))
    num_heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // num_heads
    # HF semantics: id2label decides the label count; PretrainedConfig's default is 2.
    num_labels = len(hf["id2label"]) if hf.get("id2label") else hf.get("num_labels", 2)
    if head == "classifier" and arch_head != "classifier" and not hf.get("id2label"):
        num_labels = 1  # a causal LM turned into a reward model: one scalar score
    eos = hf.get("eos_token_id")
    fields = dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        family=family,
        head=head,
        num_labels=int(num_labels),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_type=rope_type,
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=family == "qwen3",
        attention_bias=bool(hf.get("attention_bias", False)) and family != "qwen2",
        qkv_bias=family == "qwen2",  # Qwen2 hard-codes bias=True on q/k/v and none on o_proj
        mlp_bias=bool(hf.get("mlp_bias", False)),
        pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )
    fields.update(gemma)  # Gemma 3's fields, or the window of the others
    dtype = hf.get("dtype") or hf.get("torch_dtype")
    if dtype and "param_dtype" not in overrides:
        fields["param_dtype"] = str(dtype)
    fields.update(overrides)
    return ModelConfig(**fields)


def _family_hf_keys(out: dict, cfg: ModelConfig) -> dict:
    """``out`` with the keys only one family's config has: Llama's MLP bias, Gemma 3's, the sliding window."""
    if cfg.family == "llama":
        out["mlp_bias"] = cfg.mlp_bias
    elif cfg.family == "gemma3":
        out = gemma3_hf_config(out, cfg)
    elif cfg.family == "mistral":
        if any(cfg.local_layers) and not all(cfg.local_layers):
            raise ValueError("Mistral configs slide the window on every layer or none; layer_types mixes both")
        # None, not absent, for full attention: an absent key means MistralConfig's 4096.
        out["sliding_window"] = cfg.sliding_window if any(cfg.local_layers) else None
    elif any(cfg.local_layers):  # Qwen2 / Qwen3: the window on the layers layer_types marks
        local = cfg.local_layers
        out.update(use_sliding_window=True, sliding_window=cfg.sliding_window, max_window_layers=local.index(True),
                   layer_types=["sliding_attention" if x else "full_attention" for x in local])
    else:  # Qwen2 / Qwen3: full attention on every layer
        out["use_sliding_window"] = False
        out.setdefault("sliding_window", None)
        out.setdefault("max_window_layers", cfg.num_layers)
        out.pop("layer_types", None)
    return out


def to_hf_config(cfg: ModelConfig, *, dtype: str | None = None, base: Mapping[str, Any] | None = None) -> dict:
    """HF ``config.json`` dict for ``cfg`` that transformers 4.45 ... 5.x all read the same way.

    ``base`` (e.g. the source checkpoint's config) supplies keys we do not model; ours win. ``dtype`` is the
    stored weights' dtype (default ``cfg.param_dtype``).
    """
    dtype = jnp.dtype(dtype or cfg.param_dtype).name
    out = dict((text_base(base) if cfg.family == "gemma3" else base) or {})
    for stale in ("rope_scaling", "rope_parameters", "rope_theta", "torch_dtype", "dtype", "id2label", "label2id"):
        out.pop(stale, None)
    scaling = cfg.rope_scaling_dict
    rope_parameters = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **scaling}
    out.update(
        architectures=[cfg.hf_architecture],
        model_type=cfg.family,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        attention_bias=cfg.attention_bias,
        attention_dropout=0.0,
        initializer_range=cfg.initializer_range,
        pad_token_id=cfg.pad_token_id,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
        use_cache=True,
        # 4.x keys: rope_scaling None means default RoPE.
        rope_theta=cfg.rope_theta,
        rope_scaling=None if cfg.rope_type == "default" else {"rope_type": cfg.rope_type, **scaling},
        # 5.x key.
        rope_parameters=rope_parameters,
        torch_dtype=dtype,
        dtype=dtype,
    )
    out = _family_hf_keys(out, cfg)
    if cfg.head == "classifier" or cfg.num_labels != 2:
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)}
        out["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_labels)}
    return out
