"""Write a model as a Hugging Face checkpoint directory that transformers 4.45 ... 5.x loads as is.

Layout: ``model-0000i-of-0000N.safetensors`` (metadata ``{"format": "pt"}``, tensors in HF names and [out, in]
layout), ``model.safetensors.index.json`` (``metadata.total_size``, ``weight_map``), ``config.json`` with both
RoPE key sets (4.x ``rope_theta``/``rope_scaling`` and 5.x ``rope_parameters``), ``generation_config.json`` and
the tokenizer files when given. A tied ``lm_head`` is not written (we have no such parameter). Tensors are
converted and written one at a time, so host memory stays around one shard.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from longrm_jax.cli_support import InputError
from longrm_jax.hf.safetensors_io import save_file
from longrm_jax.hf.weights import to_hf, weight_rules
from longrm_jax.models.config import ModelConfig, to_hf_config

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json", "vocab.txt",
)
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """'5GB' -> 5e9 bytes (HF's decimal units), '500MiB' -> 500 * 2**20; ints pass through."""
    if isinstance(text, int):
        if text <= 0:
            raise InputError(f"size {text} must be more than 0 bytes (e.g. 5GB)")
        return text
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in _SIZE_UNITS:
        raise InputError(f"cannot parse size {text!r}; use e.g. 5GB, 500MB, 2GiB or a byte count")
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])
    if size <= 0:
        raise InputError(f"size {text!r} must be more than 0 bytes (e.g. 5GB)")
    return size


def _named_params(model_or_params) -> dict[tuple[str, ...], jax.Array]:
    state = nnx.state(model_or_params, nnx.Param) if isinstance(model_or_params, nnx.Module) else model_or_params
    if isinstance(state, nnx.State):
        return {tuple(map(str, path)): var[...] for path, var in nnx.to_flat_state(state)}
    flat = {}

    def walk(prefix, node):
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk((*prefix, str(key)), value)
        else:
            flat[prefix] = node[...] if isinstance(node, nnx.Variable) else node

    walk((), state)
    return flat


def hf_tensors(model_or_params, cfg: ModelConfig, dtype=None):
    """Yield (HF name, numpy array in HF layout) for every tensor, in checkpoint order."""
    params = model_or_params if isinstance(model_or_params, dict) and all(
        isinstance(k, tuple) for k in model_or_params) else _named_params(model_or_params)
    rules = weight_rules(list(params), cfg)
    np_dtype = None if dtype is None else np.dtype(jax.numpy.dtype(dtype))

    def convert(rule, arr):
        if isinstance(arr, jax.Array):  # layout and dtype on the device, then one fetch of the final bytes
            out = to_hf(rule, arr)
            out = out if np_dtype is None else out.astype(np_dtype)
            return np.asarray(jax.device_get(out))
        out = to_hf(rule, np.asarray(arr))
        return out if np_dtype is None else out.astype(np_dtype, copy=False)

    order = {("model", "embed"): 0, ("model", "final_norm"): 2, ("lm_head",): 3, ("score",): 3}
    stacked = [r for r in rules if r.stacked]
    for rule in sorted((r for r in rules if not r.stacked), key=lambda r: order[r.path]):
        if order[rule.path] == 2:  # all layers go between the embedding and the final norm
            for i in range(cfg.num_layers):
                for layer_rule in stacked:
                    yield layer_rule.hf_names[i], convert(layer_rule, params[layer_rule.path][i])
        yield rule.hf_names[0], convert(rule, params[rule.path])


def save_pretrained(
    model_or_params,
    out_dir: str | os.PathLike,
    *,
    config: ModelConfig | None = None,
    dtype=None,
    tokenizer_dir: str | os.PathLike | None = None,
    max_shard_bytes: int | str = DEFAULT_MAX_SHARD_BYTES,
    base_config: Mapping | None = None,
    generation_config: Mapping | None = None,
    progress: bool = True,
) -> list[str]:
    """Write ``model_or_params`` (a model, its ``nnx.State``, or a nested dict of our parameter paths) to
    ``out_dir`` as an HF checkpoint. ``config`` defaults to ``model.config``; ``dtype`` converts the stored
    weights (default: as they are); ``base_config`` (the source config.json) keeps keys we do not model.
    Returns the written file names."""
    cfg = config if config is not None else getattr(model_or_params, "config", None)
    if cfg is None:
        raise ValueError("save_pretrained needs config= when given bare parameters")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    params = _named_params(model_or_params)
    tensors = hf_tensors(params, cfg, dtype)
    if progress:
        count = sum(cfg.num_layers if path[:2] == ("model", "layers") else 1 for path in params)
        tensors = tqdm(tensors, total=count, desc="export", unit="tensor")
    shards, total, stored_dtype = _write_shards(tensors, out_dir, parse_size(max_shard_bytes))
    # A previous export with another shard count must not linger; it goes once the new shards are all written,
    # so an export that fails half way leaves the previous one whole.
    for stale in os.listdir(out_dir):
        if re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json", stale):
            os.remove(os.path.join(out_dir, stale))
    files = _name_shards(shards, total, out_dir)
    hf_config = to_hf_config(cfg, dtype=np.dtype(stored_dtype).name, base=base_config)
    _write_json(os.path.join(out_dir, "config.json"), hf_config)
    gen = dict(generation_config) if generation_config else {
        "_from_model_config": True,
        **{k: hf_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if hf_config.get(k) is not None},
    }
    _write_json(os.path.join(out_dir, "generation_config.json"), gen)
    files += ["model.safetensors.index.json", "config.json", "generation_config.json"]
    if tokenizer_dir is not None:
        for fname in TOKENIZER_FILES:
            src = os.path.join(tokenizer_dir, fname)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(out_dir, fname))
                files.append(fname)
    return files


def _write_shards(tensors, out_dir: str, max_shard_bytes: int) -> tuple[list[list[str]], int, np.dtype]:
    """Write ``(name, array)`` pairs into temporary shard files of at most ``max_shard_bytes`` (a larger tensor
    gets a shard of its own): (each shard's tensor names, total bytes, the first tensor's dtype)."""
    shards: list[list[str]] = []
    pending: dict[str, np.ndarray] = {}
    pending_bytes = total = 0
    stored_dtype = None

    def flush():
        nonlocal pending, pending_bytes
        if pending:
            save_file(pending, os.path.join(out_dir, f"_shard{len(shards):05d}.tmp"), {"format": "pt"})
            shards.append(list(pending))
            pending, pending_bytes = {}, 0

    try:
        for name, arr in tensors:
            if pending and pending_bytes + arr.nbytes > max_shard_bytes:
                flush()
            pending[name] = arr
            pending_bytes += arr.nbytes
            total += arr.nbytes
            stored_dtype = stored_dtype or arr.dtype
        flush()
    except BaseException:  # an unfinished export leaves no temporary shard behind (Ctrl-C included)
        for i in range(len(shards)):
            os.remove(os.path.join(out_dir, f"_shard{i:05d}.tmp"))
        raise
    return shards, total, stored_dtype


def _name_shards(shards: list[list[str]], total: int, out_dir: str) -> list[str]:
    """Rename :func:`_write_shards`' files to HF's ``model-0000i-of-0000n.safetensors`` and write the index that
    maps each tensor to its file; the shard file names, in order."""
    n = len(shards)
    weight_map, files = {}, []
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        os.replace(os.path.join(out_dir, f"_shard{i:05d}.tmp"), os.path.join(out_dir, fname))
        files.append(fname)
        weight_map.update({name: fname for name in names})
    _write_json(os.path.join(out_dir, "model.safetensors.index.json"),
                {"metadata": {"total_size": total}, "weight_map": weight_map})
    return files


def _write_json(path: str, obj) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True)
        fh.write("\n")
