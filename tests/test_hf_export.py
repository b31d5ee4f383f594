"""HF dir -> load_pretrained -> export -> transformers from_pretrained: same outputs, no missing keys."""

import json
import os

import numpy as np
import pytest

import torch  # the test extra installs it: a broken install fails the run, never skips
import transformers  # the test extra installs it: a broken install fails the run, never skips

from longrm_jax import load_pretrained  # noqa: E402
from longrm_jax.export import main as export_main  # noqa: E402
from longrm_jax.hf.save import parse_size, save_pretrained  # noqa: E402
from longrm_jax.hf.load import weight_files  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402


def hf_outputs(model, ids):
    mask = torch.ones_like(ids)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits.float().numpy()


@pytest.mark.parametrize(
    "family,head,tied",
    [("llama", "causal_lm", False), ("qwen3", "causal_lm", True), ("qwen3", "classifier", False)],
)
def test_round_trip_through_transformers(tmp_path, family, head, tied):
    src, out = tmp_path / "src", tmp_path / "out"
    ref_model = make_tiny_checkpoint(src, family, head, tied=tied, rope="yarn" if family == "qwen3" else "llama3",
                                     kv_heads=1)
    model = load_pretrained(src)
    files = save_pretrained(model, out, max_shard_bytes=60_000, tokenizer_dir=src, progress=False)

    shards = sorted(f for f in files if f.endswith(".safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensors = weight_files(out)
    assert set(index["weight_map"]) == set(tensors)
    assert index["metadata"]["total_size"] == sum(f.nbytes(n) for n, f in tensors.items())
    assert all(f.metadata == {"format": "pt"} for f in tensors.values())
    assert ("lm_head.weight" in tensors) == (head == "causal_lm" and not tied)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert config["rope_scaling"]["rope_type"] == config["rope_parameters"]["rope_type"]
    assert (out / "generation_config.json").is_file()

    auto = transformers.AutoModelForCausalLM if head == "causal_lm" else transformers.AutoModelForSequenceClassification
    reloaded, info = auto.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids = torch.randint(3, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(hf_outputs(reloaded.eval(), ids), hf_outputs(ref_model, ids))


def test_bf16_checkpoint_round_trips_bit_for_bit_via_cli(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tiny_checkpoint(src, "qwen3", dtype=torch.bfloat16, rope="yarn")
    (src / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    (src / "tokenizer.json").write_text("{}")
    assert export_main(["--checkpoint", str(src), "--out", str(out), "--max-shard-size", "100KB"]) == 0
    assert "wrote" in capsys.readouterr().out
    original, exported = weight_files(src), weight_files(out)
    assert set(original) == set(exported)
    for name, f in original.items():
        a, b = f.read(name), exported[name].read(name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
    assert (out / "tokenizer_config.json").read_text() == '{"model_max_length": 128}'
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"


def test_export_dtype_conversion_and_fp32_source(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    ref_model = make_tiny_checkpoint(src, "llama")
    save_pretrained(load_pretrained(src), out, dtype="bfloat16", progress=False)
    tensors = weight_files(out)
    name = "model.layers.1.mlp.down_proj.weight"
    assert tensors[name].dtype(name).name == "bfloat16"
    expected = ref_model.state_dict()[name].to(torch.bfloat16).view(torch.int16).numpy()
    assert tensors[name].read(name).view(np.int16).tobytes() == expected.tobytes()


def test_cli_help_and_size_parsing(capsys):
    with pytest.raises(SystemExit) as exc:
        export_main(["--help"])
    assert exc.value.code == 0 and "--max-shard-size" in capsys.readouterr().out
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size(123) == 123
    with pytest.raises(ValueError, match="cannot parse size"):
        parse_size("5 parsecs")


def test_stale_shards_are_removed(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tiny_checkpoint(src, "llama", tied=True)
    model = load_pretrained(src)
    save_pretrained(model, out, max_shard_bytes=50_000, progress=False)
    save_pretrained(model, out, progress=False)
    assert sorted(f for f in os.listdir(out) if f.endswith(".safetensors")) == ["model-00001-of-00001.safetensors"]


def test_a_failed_export_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    """The previous export's shards go only once the new ones are written: a conversion that fails half way
    (here the third tensor, after a shard was written) leaves the directory as it was."""
    from longrm_jax.hf import save as save_module

    src, out = tmp_path / "src", tmp_path / "out"
    make_tiny_checkpoint(src, "llama", tied=True)
    model = load_pretrained(src)
    save_pretrained(model, out, max_shard_bytes=50_000, progress=False)
    assert len([f for f in os.listdir(out) if f.endswith(".safetensors")]) > 1
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    real = save_module.hf_tensors

    def failing(*args, **kwargs):
        for i, item in enumerate(real(*args, **kwargs)):
            if i == 2:
                raise RuntimeError("conversion failed")
            yield item

    monkeypatch.setattr(save_module, "hf_tensors", failing)
    with pytest.raises(RuntimeError, match="conversion failed"):
        save_pretrained(model, out, max_shard_bytes=1, progress=False)  # a shard per tensor: two written
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
