"""Bad checkpoints fail before anything is placed on a device, with an error naming the file, tensor or key."""

import gc
import json
import logging

import jax
import numpy as np
import pytest

import torch  # noqa: F401 - the test extra installs it: a broken install fails the run, never skips
import transformers  # noqa: F401

from longrm_jax import load_pretrained  # noqa: E402
from longrm_jax.hf.load import CheckpointError  # noqa: E402
from longrm_jax.hf.safetensors_io import SafetensorsError, SafetensorsFile, save_file  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    make_tiny_checkpoint(path, "llama", layers=1)
    return path


@pytest.fixture
def ckpt(tiny_dir, tmp_path):
    """A fresh copy of the tiny checkpoint to break."""
    import shutil

    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, dst)
    return dst


def rewrite_tensors(ckpt, change):
    f = SafetensorsFile(ckpt / "model.safetensors")
    tensors = {name: f.read(name) for name in f.keys()}
    change(tensors)
    save_file(tensors, ckpt / "model.safetensors", {"format": "pt"})


def edit_config(ckpt, change):
    cfg = json.loads((ckpt / "config.json").read_text())
    change(cfg)
    (ckpt / "config.json").write_text(json.dumps(cfg))


def assert_fails_cleanly(ckpt, exc_type, match):
    gc.collect()
    before = len(jax.live_arrays())
    with pytest.raises(exc_type, match=match):
        load_pretrained(ckpt)
    assert len(jax.live_arrays()) == before  # nothing half-loaded left on a device


def test_missing_tensor_is_named(ckpt):
    rewrite_tensors(ckpt, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    assert_fails_cleanly(ckpt, CheckpointError, r"missing.*'model\.layers\.0\.mlp\.up_proj\.weight'")


def test_shape_mismatch_names_tensor_and_file(ckpt):
    rewrite_tensors(ckpt, lambda t: t.update({"model.norm.weight": np.ones(63, np.float32)}))
    assert_fails_cleanly(ckpt, CheckpointError, r"model\.safetensors: tensor 'model\.norm\.weight' has shape \[63\]")


def test_unexpected_tensor_is_named_but_inv_freq_is_ignored(ckpt):
    rewrite_tensors(ckpt, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)}))
    load_pretrained(ckpt)  # a harmless buffer from old transformers versions
    rewrite_tensors(ckpt, lambda t: t.update({"model.layers.0.adapter.weight": np.ones(4, np.float32)}))
    assert_fails_cleanly(ckpt, CheckpointError, r"unexpected.*'model\.layers\.0\.adapter\.weight'")


def test_unknown_architecture_is_named(ckpt):
    edit_config(ckpt, lambda c: c.update(architectures=["GPT2LMHeadModel"]))
    assert_fails_cleanly(ckpt, CheckpointError, r"config\.json.*'GPT2LMHeadModel'.*supported.*Qwen3ForCausalLM")


def test_unknown_rope_type_is_named(ckpt):
    edit_config(ckpt, lambda c: c.update(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}))
    assert_fails_cleanly(ckpt, CheckpointError, r"config\.json.*'longrope'.*supported")


def test_truncated_safetensors_names_file(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    assert_fails_cleanly(ckpt, SafetensorsError, r"model\.safetensors: truncated.*tensor '")


def test_corrupt_header_names_file(ckpt):
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"\xff" * 12
    path.write_bytes(bytes(data))
    assert_fails_cleanly(ckpt, SafetensorsError, r"model\.safetensors: corrupt")
    path.write_bytes(b"\x01\x02")
    assert_fails_cleanly(ckpt, SafetensorsError, r"model\.safetensors: truncated")


def test_missing_files_are_named(ckpt, tmp_path):
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    assert_fails_cleanly(ckpt, CheckpointError, r"model-00002-of-00002\.safetensors.*missing")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_pretrained(tmp_path / "nope")


def test_causal_lm_checkpoint_loads_as_classifier_with_fresh_score(ckpt, caplog):
    with caplog.at_level(logging.WARNING, logger="longrm_jax.hf.load"):
        model = load_pretrained(ckpt, head="classifier")
    assert type(model).__name__ == "SequenceClassifier"
    assert "score" in caplog.text
    out = model(jax.numpy.array([[5, 6, 7, 0]]))
    assert out.shape == (1, 1) and np.isfinite(np.asarray(out)).all()
