"""Load a local Hugging Face checkpoint directory into a ``CausalLM`` / ``SequenceClassifier``.

Everything is checked before any weight is placed on a device (config, architecture, RoPE type, every file
header, every tensor's presence and shape, unexpected tensors), so a bad checkpoint raises an error naming
the file / tensor / key and no half-loaded model is ever returned.

Placement: each parameter is built with ``jax.make_array_from_callback``; the callback receives the index
of one device's shard and reads just that slice from the memory-mapped safetensors file (for stacked layer
weights it reads that slice from each layer's tensor and stacks them). So no device ever receives, and the
host never materialises per device, more than that device's shard, and device peak ~= the weights' bytes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from longrm_jax.cli_support import InputError
from longrm_jax.hf.safetensors_io import SafetensorsFile
from longrm_jax.hf.weights import HARMLESS_EXTRA, WeightRule, read_slice, weight_rules
from longrm_jax.models.config import ModelConfig, from_hf_config
from longrm_jax.models.heads import build_model
from longrm_jax.parallel.mesh import logical_to_spec

log = logging.getLogger(__name__)
_POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="hf-load")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(InputError):
    """The checkpoint directory cannot be loaded as asked (message names the file, tensor or key)."""


def _looks_like_training_checkpoint(path) -> bool:
    """A run's output_dir, its checkpoints/ or one step folder (layout of training.checkpoint)."""
    path = str(path)
    if not os.path.isdir(path):
        return False
    if os.path.isdir(os.path.join(path, "state")) or os.path.isdir(os.path.join(path, "checkpoints")):
        return True
    return any(d.isdigit() and os.path.isdir(os.path.join(path, d, "state")) for d in os.listdir(path))


def read_hf_config(path: str | os.PathLike) -> dict:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        if _looks_like_training_checkpoint(path):
            raise CheckpointError(
                f"{path}: a training checkpoint (orbax), not a Hugging Face directory; convert it first: "
                f"python -m longrm_jax.export --checkpoint {path} --out DIR")
        raise CheckpointError(f"{path}: no config.json (expected a local Hugging Face checkpoint directory)")
    try:
        with open(cfg_path) as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path}: invalid JSON: {exc}") from exc


def weight_files(path: str | os.PathLike) -> dict[str, SafetensorsFile]:
    """tensor name -> opened file, from the index (sharded) or the single / only safetensors file."""
    path = os.fspath(path)
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index_path):
        try:
            with open(index_path) as fh:
                weight_map = json.load(fh)["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index_path}: not a valid safetensors index ({exc})") from exc
        files = sorted(set(weight_map.values()))
    elif os.path.isfile(os.path.join(path, SINGLE_FILE)):
        weight_map, files = None, [SINGLE_FILE]
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        weight_map = None
        if not files:
            raise CheckpointError(f"{path}: no *.safetensors weights (pytorch_model.bin is not supported)")
    opened = {}
    for name in files:
        fpath = os.path.join(path, name)
        if not os.path.isfile(fpath):
            raise CheckpointError(f"{fpath}: listed in {INDEX_FILE} but missing")
        opened[name] = SafetensorsFile(fpath)
    by_tensor: dict[str, SafetensorsFile] = {}
    for name, f in opened.items():
        for key in f.keys():
            if key in by_tensor:
                raise CheckpointError(f"tensor {key!r} appears in both {by_tensor[key].path} and {f.path}")
            by_tensor[key] = f
    if weight_map is not None:
        for key, fname in weight_map.items():
            if key not in by_tensor or os.path.basename(by_tensor[key].path) != fname:
                raise CheckpointError(f"{index_path}: tensor {key!r} is mapped to {fname}, which does not hold it")
    return by_tensor


def _target_sharding(names, mesh: Mesh | None, rules):
    if mesh is None:
        return SingleDeviceSharding(jax.devices()[0])
    return NamedSharding(mesh, logical_to_spec(names, rules, mesh))


def _build_array(rule: WeightRule, tensors, shape, dtype, sharding) -> jax.Array:
    def read(name, index):
        return tensors[name].read(name, index)

    def callback(index):
        index = tuple(index) + (slice(None),) * (len(shape) - len(index))
        if not rule.stacked:
            return read_slice(rule, read, rule.hf_names[0], shape, index).astype(dtype, copy=False)
        layers = range(*index[0].indices(shape[0]))
        block_shape = (len(layers), *(len(range(*s.indices(n))) for s, n in zip(index[1:], shape[1:])))
        block = np.empty(block_shape, dtype)  # filled layer by layer: no second host copy from np.stack

        def fill(j, layer):
            block[j] = read_slice(rule, read, rule.hf_names[layer], shape[1:], index[1:])

        # numpy's copies / transposes release the GIL, so layers convert in parallel.
        list(_POOL.map(fill, range(len(layers)), layers))
        return block

    return jax.make_array_from_callback(tuple(shape), sharding, callback)


def load_pretrained(
    path: str | os.PathLike,
    *,
    dtype=None,
    param_dtype=None,
    mesh: Mesh | None = None,
    head: str | None = None,
    rules: Mapping | None = None,
    seed: int = 0,
    **config_overrides,
):
    """Load ``path`` (local HF directory: config.json + model.safetensors or sharded safetensors + index).

    Args:
      dtype: compute dtype (default: ``param_dtype``).
      param_dtype: parameter dtype (default: the checkpoint's ``torch_dtype`` / ``dtype``).
      mesh: place every weight directly in its ``NamedSharding`` (logical names -> mesh axes by ``rules``,
        default ``parallel.mesh.DEFAULT_RULES``); None puts everything on ``jax.devices()[0]``.
      head: "causal_lm" or "classifier" to override the architecture's head. Loading a causal-LM checkpoint
        as a classifier drops ``lm_head`` and initialises ``score`` like HF (normal(0, initializer_range),
        ``seed``), with a warning.
      config_overrides: other ``ModelConfig`` fields (``remat``, ``scan_layers``, ``attention_impl`` ...).

    Returns ``CausalLM`` or ``SequenceClassifier``.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (only local Hugging Face checkpoint directories load)")
    hf_config = read_hf_config(path)
    overrides = dict(config_overrides)
    if param_dtype is not None:
        overrides["param_dtype"] = jnp.dtype(param_dtype).name
    try:
        cfg = from_hf_config(hf_config, head=head, **overrides)
    except ValueError as exc:
        raise CheckpointError(f"{os.path.join(path, 'config.json')}: {exc}") from exc
    if dtype is not None or "dtype" not in overrides:
        cfg = cfg.replace(dtype=jnp.dtype(dtype or cfg.param_dtype).name)
    tensors = weight_files(path)
    if cfg.family == "gemma3":
        tensors = language_model_tensors(tensors, path)
    return load_weights(cfg, tensors, mesh=mesh, rules=rules, seed=seed, source=path)


# Where multimodal Gemma 3 checkpoints keep the language model: transformers 4.50+ writes (and 5.x still writes)
# language_model.model.*, the 4.52-5.x module tree is model.language_model.*.
_LANGUAGE_MODEL_PREFIXES = ("language_model.model.", "model.language_model.")
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


class _RenamedTensor:
    """One tensor of a safetensors file, read under another name (the text model's)."""

    def __init__(self, file: SafetensorsFile, name: str):
        self._file, self._name = file, name
        self.path = file.path

    def read(self, _name, index=None):
        return self._file.read(self._name, index)

    def shape(self, _name):
        return self._file.shape(self._name)

    def dtype(self, _name):
        return self._file.dtype(self._name)


def language_model_tensors(tensors: Mapping[str, SafetensorsFile], source: str) -> dict:
    """A multimodal Gemma 3 checkpoint's language model under the text model's names (``model.*``,
    ``lm_head.weight``), its vision tower and projector skipped with one log line; other checkpoints as they
    are."""
    prefix = next((p for p in _LANGUAGE_MODEL_PREFIXES if any(n.startswith(p) for n in tensors)), None)
    if prefix is None:
        return dict(tensors)
    out, skipped = {}, 0
    for name, file in tensors.items():
        if name.startswith(prefix):
            out["model." + name[len(prefix):]] = _RenamedTensor(file, name)
        elif name == "language_model.lm_head.weight":
            out["lm_head.weight"] = _RenamedTensor(file, name)
        elif name.startswith(_VISION_PREFIXES):
            skipped += 1
        else:  # score.weight, lm_head.weight
            out[name] = file
    log.info("%s: multimodal Gemma 3 checkpoint: loading its language model (%s*); vision tower and projector "
             "skipped (%d tensors)", source, prefix, skipped)
    return out


def _check_extra_tensors(cfg: ModelConfig, tensors: Mapping[str, SafetensorsFile], used: set, source: str) -> None:
    """Checkpoint tensors the model does not take: an error for any that matter, a log line for harmless ones."""
    extra = sorted(set(tensors) - used)
    harmless = [n for n in extra if any(p.match(n) for p in HARMLESS_EXTRA)]
    if cfg.head == "classifier" and "lm_head.weight" in extra:
        harmless.append("lm_head.weight")
        log.warning("%s: loading a causal-LM checkpoint as a classifier; lm_head dropped", source)
    if cfg.tie_word_embeddings and "lm_head.weight" in extra and "lm_head.weight" not in harmless:
        harmless.append("lm_head.weight")  # HF ignores a saved lm_head when embeddings are tied
    unexpected = [n for n in extra if n not in harmless]
    if unexpected:
        shown = ", ".join(repr(u) for u in unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
        raise CheckpointError(f"{source}: {len(unexpected)} unexpected tensor(s) for {cfg.hf_architecture}: {shown}")
    dropped_head = cfg.head == "classifier" and "lm_head.weight" in extra  # its warning above says so
    quiet = [n for n in harmless if not (dropped_head and n == "lm_head.weight")]
    if quiet:
        log.info("%s: ignoring %d harmless tensor(s), e.g. %s", source, len(quiet), quiet[0])


def load_weights(cfg: ModelConfig, tensors: Mapping[str, SafetensorsFile], *, mesh=None, rules=None, seed=0,
                 source: str = "checkpoint"):
    """Build the model for ``cfg`` from already opened safetensors files (tensor name -> file)."""
    abstract = nnx.eval_shape(lambda: build_model(cfg, rules=rules))
    graphdef, abs_state = nnx.split(abstract)
    flat = list(nnx.to_flat_state(abs_state))
    rule_list = weight_rules([p for p, _ in flat], cfg)

    # 1. Validate everything before touching a device.
    used, missing, fresh = set(), [], set()
    for (path, var), rule in zip(flat, rule_list):
        for name in rule.hf_names:
            if name not in tensors:
                if rule.path == ("score",) and ("lm_head.weight" in tensors or cfg.tie_word_embeddings):
                    # A causal-LM checkpoint loaded as a classifier (tied ones, e.g. Gemma 3 or the small Qwen
                    # sizes, store no lm_head): a new score head.
                    fresh.add(rule.path)
                    break
                missing.append(name)
                continue
            used.add(name)
            expected = rule.hf_shape(tuple(var.shape))
            if tuple(tensors[name].shape(name)) != expected:
                raise CheckpointError(
                    f"{tensors[name].path}: tensor {name!r} has shape {list(tensors[name].shape(name))}, "
                    f"expected {list(expected)} for config {cfg.hf_architecture}"
                )
    if missing:
        shown = ", ".join(repr(m) for m in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise CheckpointError(f"{source}: {len(missing)} tensor(s) missing from the checkpoint: {shown}")
    _check_extra_tensors(cfg, tensors, used, source)

    # 2. Place each weight directly in its sharding.
    rules_map = dict(rules) if rules is not None else None
    values = {}
    for (path, var), rule in zip(flat, rule_list):
        names = var.get_metadata().get("out_sharding")
        sharding = _target_sharding(names, mesh, rules_map)
        if rule.path in fresh:
            log.warning("%s: no %r in the checkpoint; initialising it randomly (seed %d)", source, "score.weight", seed)
            init = cfg.initializer_range * jax.random.normal(jax.random.key(seed), var.shape, jnp.float32)
            values[path] = jax.device_put(init.astype(var.dtype), sharding)
        else:
            values[path] = _build_array(rule, tensors, tuple(var.shape), np.dtype(var.dtype), sharding)
    for path, var in flat:
        var.set_value(values[path])
    return nnx.merge(graphdef, abs_state)
