"""python -m longrm_jax.train: --help, --print-config, and config errors reported with exit status 2."""

import pytest
import yaml

from longrm_jax.train import DEFAULT_CONFIG, main


def test_help_and_print_config(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--resume" in capsys.readouterr().out
    assert main(["--print-config", "--set", "optim.lr=1e-4"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["optim"]["lr"] == 1e-4 and printed["stage"] == DEFAULT_CONFIG["stage"]


def test_unknown_key_exits_2_listing_valid_keys(capsys, tmp_path):
    assert main(["--set", "optim.learning_rate=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'learning_rate'" in err and "valid keys:" in err and "warmup_ratio" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("stage: bt\nmodell:\n  preset: tiny_qwen3\n")
    assert main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "unknown key 'modell'" in err and "model" in err


def test_shipped_configs_load():
    import glob
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sorted(glob.glob(os.path.join(root, "configs", "*.yaml")))
    assert len(paths) >= 7
    for path in paths:
        assert main(["--config", path, "--print-config"]) == 0, path


def test_the_default_run_is_package_data_with_one_copy():
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    packaged = os.path.join(root, "longrm_jax", "configs", "tiny_default.yaml")
    linked = os.path.join(root, "configs", "tiny_default.yaml")
    assert os.path.realpath(linked) == os.path.realpath(packaged)  # configs/ links the package's file
    with open(packaged) as f:
        assert yaml.safe_load(f) == DEFAULT_CONFIG
