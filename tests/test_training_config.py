"""YAML config + --set overrides: typed parsing and unknown keys rejected with the valid keys listed."""

import re

import pytest

from longrm_jax.training.config import ConfigError, load_config


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("stage: simpo\noptim:\n  lr: 2e-6\nlora:\n  targets: [q_proj, v_proj]\n")
    cfg = load_config(path, ["optim.warmup_ratio=0.03", "mesh.seq=2", "model.overrides.num_layers=3",
                             "checkpoint.dir=null", "lora.targets=q_proj,k_proj", "progress=false"])
    assert cfg.stage == "simpo" and cfg.optim.lr == 2e-6 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.warmup_ratio == 0.03 and cfg.mesh.seq == 2
    assert cfg.model.overrides == {"num_layers": 3}
    assert cfg.checkpoint.dir is None and cfg.progress is False
    assert cfg.lora.targets == ["q_proj", "k_proj"]
    assert cfg.head == "causal_lm"


def test_unknown_key_lists_valid_keys(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  learning_rate: 1e-5\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert str(path) in msg and "optim: unknown key 'learning_rate'" in msg
    assert "valid keys" in msg and "lr" in msg and "warmup_ratio" in msg
    with pytest.raises(ConfigError, match="unknown key 'stages'.*valid keys:.*stage"):
        load_config(None, ["stages=bt"])
    with pytest.raises(ConfigError, match="unknown key 'sizes' at mesh; valid keys: auto, data, fsdp, optimizer_axes, param_axes, seq, tensor"):
        load_config(None, ["mesh.sizes=2"])


def test_type_errors_name_the_key():
    with pytest.raises(ConfigError, match="mesh.seq: expected an integer"):
        load_config(None, ["mesh.seq=two"])
    with pytest.raises(ConfigError, match="stage must be one of"):
        load_config(None, ["stage=dpo"])
    with pytest.raises(ConfigError, match=r"data.batch_rows \(3\) must be a multiple of 1 \+ data.num_rejects"):
        load_config(None, ["stage=simpo", "data.layout=rows", "data.batch_rows=3"])
    with pytest.raises(ConfigError, match="grad_accum must be >= 1"):
        load_config(None, ["grad_accum=0"])


def test_a_bare_on_read_as_a_boolean_says_to_quote_it():
    """YAML 1.1 reads on/off/yes/no as booleans; a string key given one says so, and the quoted word loads."""
    with pytest.raises(ConfigError, match=r'distributed\.mode: expected a string, got True \(YAML reads a bare '
                                          r'on/off/yes/no as true/false: quote the word, e.g. "on"\)'):
        load_config(None, ["distributed.mode=on"])
    assert load_config(None, ['distributed.mode="on"']).distributed.mode == "on"


def test_batch_rows_are_per_micro_step():
    """An optimizer step takes batch_rows x grad_accum model rows; the rows layout spends 1 + R per group."""
    cfg = load_config(None, ["data.batch_rows=2", "grad_accum=8"])
    assert cfg.pipeline_rows_per_step == 16
    cfg = load_config(None, ["stage=simpo", "data.layout=rows", "data.batch_rows=2", "grad_accum=8"])
    assert cfg.pipeline_rows_per_step == 8  # groups of chosen + rejected, one per micro step


@pytest.mark.parametrize("override, key", [
    ("steps=-5", "steps"), ("optim.lr=-1", "optim.lr"), ("epochs=-1", "epochs"),
    ("checkpoint.every=-10", "checkpoint.every"), ("data.batch_rows=0", "data.batch_rows"),
    ("mesh.seq=0", "mesh.seq"), ("optim.warmup_ratio=2", "optim.warmup_ratio"),
    ("model.compute_dtype=fp32", "model.compute_dtype"), ("model.param_dtype=half", "model.param_dtype"),
])
def test_out_of_range_values_are_refused_naming_the_key(override, key):
    # Used to be accepted (a run that trains nothing) or crash later (batch_rows=0: ZeroDivisionError).
    with pytest.raises(ConfigError, match=rf"^config \+ --set: {re.escape(key)} must be "):
        load_config(None, [override])


def test_train_cli_prints_one_line_for_a_bad_range(capsys):
    from longrm_jax.train import main

    assert main(["--set", "data.batch_rows=0"]) == 2
    assert capsys.readouterr().err == "error: config + --set: data.batch_rows must be >= 1; got 0\n"
