"""LoRA as low-rank deltas on the flat parameter dict: ``W_eff = W + (alpha / r) * A @ B``.

Each targeted weight is viewed as a matrix [in, out] (per layer when stacked: the leading ``layers`` axis is a
batch axis). Its logical names decide the view: weights whose first non-layer axis is ``embed`` read the model
dimension (q/k/v/gate/up projections: in = D); the others write it (o/down projections: out = D). A is
initialised like peft (uniform +-1/sqrt(in)), B at zero, so training starts from the base model exactly.

Two ways to run the adapted model:

- merged (``effective_params``): ``W + scale * A @ B`` as ordinary weights. Export, evaluation of a training
  checkpoint and the tiny adapters outside the layers (the score head) use it.
- as branches (``split_layer_branches``, the train step): each layer computes ``x @ W + (x @ A) @ (scale * B)``
  with the frozen ``W`` as stored. Why not merge inside the train step: merging the stacked layer weights
  materialises a second copy of every weight (in the base's dtype: fp32 for an fp32 base), and the gradient of
  the adapters then flows through the gradient of that merged weight, a full [layers, in, out] array per
  targeted weight -- on Llama-3.1-8B with an fp32 base about 2 x 28 GiB of temporaries, and the weight-gradient
  matmuls (2 N FLOPs per token) that LoRA exists to skip. With branches the frozen weights get no gradient at
  all: the step computes the forward, the activation gradients and the rank-r adapter gradients
  (docs/flops.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

# Parameter names (last path component) of the decoder's linear layers.
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _leaf(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def select_targets(keys, targets) -> list[str]:
    """Parameter keys that get adapters. ``targets``: leaf names / path suffixes, or ``all-linear``."""
    names = set()
    for t in targets:
        names.update(ALL_LINEAR if t == "all-linear" else (t,))
    chosen = [k for k in keys if _leaf(k) in names or any(k.endswith("/" + n) for n in names)]
    if not chosen:
        raise ValueError(f"LoRA targets {list(targets)} match no parameter; parameter names end in e.g. "
                         f"{sorted({_leaf(k) for k in keys})}")
    return sorted(chosen)


def select_train_modules(keys, modules) -> list[str]:
    """Keys of parameters trained fully next to the adapters (a path component equal to a module name)."""
    return sorted(k for k in keys if any(m in k.split("/") for m in modules))


def matrix_view(shape, names) -> tuple[int, int, int]:
    """(number of leading layer axes, in size, out size) of a weight for its LoRA matrix view."""
    names = tuple(names) if names else (None,) * len(shape)
    lead = 0
    while lead < len(shape) and names[lead] == "layers":
        lead += 1
    rest_shape, rest_names = shape[lead:], names[lead:]
    if len(rest_shape) < 2:
        raise ValueError(f"LoRA needs a matrix, got shape {shape} with axes {names}")
    n_in = 1 if rest_names[0] == "embed" else len(rest_shape) - 1
    return lead, int(np.prod(rest_shape[:n_in])), int(np.prod(rest_shape[n_in:]))


def init_adapters(shapes: Mapping[str, tuple], names: Mapping[str, tuple], targets, rank: int, key) -> dict:
    """Adapters {param_key + "/lora_a": [*layers, in, r], param_key + "/lora_b": [*layers, r, out]} (fp32)."""
    out = {}
    for i, k in enumerate(targets):
        shape = tuple(shapes[k])
        lead, n_in, n_out = matrix_view(shape, names.get(k))
        bound = 1.0 / math.sqrt(n_in)
        out[k + "/lora_a"] = jax.random.uniform(
            jax.random.fold_in(key, i), shape[:lead] + (n_in, rank), jnp.float32, -bound, bound
        )
        out[k + "/lora_b"] = jnp.zeros(shape[:lead] + (rank, n_out), jnp.float32)
    return out


def merge(base: Mapping[str, jax.Array], adapters: Mapping[str, jax.Array], *, alpha: float, rank: int) -> dict:
    """Base weights with every adapter's delta added (in the base weight's dtype)."""
    merged = dict(base)
    scale = alpha / rank
    for key_a, a in adapters.items():
        if not key_a.endswith("/lora_a"):
            continue
        k = key_a[: -len("/lora_a")]
        b = adapters[k + "/lora_b"]
        w = base[k]
        delta = jnp.einsum("...ir,...ro->...io", a.astype(jnp.float32), b.astype(jnp.float32)) * scale
        merged[k] = (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(w.dtype)
    return merged


def is_adapter(key: str) -> bool:
    return key.endswith(("/lora_a", "/lora_b"))


def is_layer_weight(key: str) -> bool:
    """Whether ``key`` names a stacked decoder-layer weight (``.../layers/<name>``)."""
    return key.rsplit("/", 2)[-2:-1] == ["layers"]


def split_layer_branches(trainable: Mapping, frozen: Mapping, *, alpha: float, rank: int) -> tuple[dict, dict]:
    """(weights for the model, layer branches) of a train step: the weights as :func:`effective_params` gives
    them except that adapters on decoder-layer weights are not merged; those come back as branches
    ``{"<name>/lora_a": A [L, in, r], "<name>/lora_b": scale * B [L, r, out]}`` (``<name>`` the layer weight's
    name, e.g. ``q_proj``) for :func:`longrm_jax.models.layers.layer_forward` to apply as
    ``x @ W + (x @ A) @ B``. Full fine-tuning: (trainable, {})."""
    if not frozen:
        return dict(trainable), {}
    adapted = {k[: -len("/lora_a")] for k in trainable if k.endswith("/lora_a")}
    layer_keys = {k for k in adapted if is_layer_weight(k)}
    rest = {k: v for k, v in trainable.items() if not any(k.startswith(w + "/") for w in layer_keys)}
    branches = {}
    scale = alpha / rank
    for k in sorted(layer_keys):
        name = k.rsplit("/", 1)[-1]
        branches[name + "/lora_a"] = trainable[k + "/lora_a"]
        branches[name + "/lora_b"] = trainable[k + "/lora_b"] * scale
    return effective_params(rest, frozen, alpha=alpha, rank=rank), branches


def effective_params(trainable: Mapping, frozen: Mapping, *, alpha: float, rank: int) -> dict:
    """The weights the model runs with: full fine-tuning (``frozen`` empty) ``trainable`` itself; LoRA the frozen
    base plus the fully trained modules of ``trainable``, with every adapter's delta merged in."""
    if not frozen:
        return dict(trainable)
    adapters = {k: v for k, v in trainable.items() if is_adapter(k)}
    base = dict(frozen) | {k: v for k, v in trainable.items() if k not in adapters}
    return merge(base, adapters, alpha=alpha, rank=rank)
