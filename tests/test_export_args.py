"""``python -m longrm_jax.export`` argument checks before any work (issue 29 item 11): a tokenizer directory
that does not exist or holds no tokenizer, an unknown dtype or shard size; weight files readable like the rest."""

import os

import pytest

pytest.importorskip("torch")

from longrm_jax import export as export_cli  # noqa: E402
from longrm_jax.data.tiny_tokenizer import TINY_TOKENIZER_DIR  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def hf_src(tmp_path_factory):
    src = tmp_path_factory.mktemp("hf") / "src"
    make_tiny_checkpoint(src, "llama")
    return src


@pytest.fixture
def no_loading(monkeypatch):
    monkeypatch.setattr(export_cli, "resolve_checkpoint", lambda *a, **k: pytest.fail("got past the checks"))


def test_bad_tokenizer_dir_is_refused_before_loading(tmp_path, hf_src, no_loading, capsys):
    out = tmp_path / "out"
    assert export_cli.main(["--checkpoint", str(hf_src), "--out", str(out), "--tokenizer-dir", "/nonexistent"]) == 2
    assert capsys.readouterr().err == "error: --tokenizer-dir /nonexistent: not a directory\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_cli.main(["--checkpoint", str(hf_src), "--out", str(out), "--tokenizer-dir", str(empty)]) == 2
    assert capsys.readouterr().err == (f"error: --tokenizer-dir {empty}: no tokenizer files (expected some of "
                                       "tokenizer.json, tokenizer_config.json, special_tokens_map.json, ...)\n")
    assert not out.exists()


def test_bad_dtype_and_shard_size_are_refused_before_loading(tmp_path, hf_src, no_loading, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        export_cli.main(["--checkpoint", str(hf_src), "--out", str(out), "--dtype", "float9"])
    assert exc.value.code == 2 and "argument --dtype: invalid choice: 'float9'" in capsys.readouterr().err
    assert export_cli.main(["--checkpoint", str(hf_src), "--out", str(out), "--max-shard-size", "5 apples"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot parse size '5 apples'")
    assert not out.exists()


def test_weights_have_the_mode_of_the_other_files(tmp_path, hf_src, capsys):
    out = tmp_path / "out"
    old = os.umask(0o022)
    try:
        assert export_cli.main(["--checkpoint", str(hf_src), "--out", str(out), "--tokenizer-dir",
                                TINY_TOKENIZER_DIR]) == 0
    finally:
        os.umask(old)
    modes = {name: os.stat(out / name).st_mode & 0o777 for name in os.listdir(out)}
    assert "tokenizer.json" in modes and any(name.endswith(".safetensors") for name in modes)
    assert set(modes.values()) == {0o644}, modes
    assert "holds no tokenizer" not in capsys.readouterr().err


def test_export_without_any_tokenizer_warns(tmp_path, hf_src, capsys):
    out = tmp_path / "out"
    assert export_cli.main(["--checkpoint", str(hf_src), "--out", str(out)]) == 0
    assert capsys.readouterr().err.endswith(
        f"warning: {out} holds no tokenizer ({hf_src} has no tokenizer files): evaluate and transformers need one; "
        "export again with --tokenizer-dir DIR\n")
