"""``python -m longrm_jax.export`` never destroys files it was not asked to replace, refuses a head it cannot
honour, accepts a step folder, and prints one-line errors without absl noise."""

import os

import pytest

import torch  # the test extra installs it: a broken install fails the run, never skips

from longrm_jax import export as export_cli  # noqa: E402
from longrm_jax.hf.load import weight_files  # noqa: E402
from helpers.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402
from longrm_jax.train import DEFAULT_CONFIG  # noqa: E402
from longrm_jax.training import loop  # noqa: E402
from longrm_jax.training.config import load_config  # noqa: E402

TINY = ["data.seq_len=256", "data.batch_rows=2", "data.synthetic.lengths=[8]", "data.num_train=4", "steps=1",
        "eval_before=false", "eval_after=false", "tensorboard=false", "progress=false"]


@pytest.fixture(scope="module")
def hf_src(tmp_path_factory):
    src = tmp_path_factory.mktemp("hf") / "src"
    make_tiny_checkpoint(src, "llama")
    return src


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A one-step SimPO run (causal-LM head) with its checkpoint."""
    out = tmp_path_factory.mktemp("run") / "run"
    loop.run(load_config(None, TINY + [f"output_dir={out}"], base=DEFAULT_CONFIG))
    return out


def _bytes(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def test_non_empty_out_is_refused_without_overwrite(tmp_path, hf_src, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert export_cli.main(["--checkpoint", str(hf_src), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {out} is not empty; pass --overwrite to replace its contents, "
                                       "or choose a new directory\n")
    assert _bytes(out) == {"notes.txt": b"mine"}
    # --overwrite swaps in a complete export: no leftover of the old directory, no staging folder beside it.
    assert export_cli.main(["--checkpoint", str(hf_src), "--out", str(out), "--overwrite"]) == 0
    assert "notes.txt" not in os.listdir(out) and "config.json" in os.listdir(out)
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert oct(os.stat(out).st_mode & 0o777) != oct(0o700)


@pytest.mark.parametrize("where", ["same", "inside"])
def test_out_overlapping_the_source_is_refused_and_the_source_kept(tmp_path, hf_src, capsys, where):
    out = hf_src if where == "same" else hf_src / "export"
    before = _bytes(hf_src)
    assert export_cli.main(["--checkpoint", str(hf_src), "--out", str(out), "--dtype", "bfloat16",
                            "--overwrite"]) == 2
    assert capsys.readouterr().err == (f"error: --out {out} overlaps --checkpoint {hf_src}: writing there could "
                                       "destroy the source; choose a directory outside it\n")
    assert _bytes(hf_src) == before


def test_head_the_checkpoint_was_not_trained_with_is_refused(tmp_path, trained_run, capsys):
    out = tmp_path / "out"
    assert export_cli.main(["--checkpoint", str(trained_run), "--out", str(out), "--head", "classifier"]) == 2
    assert capsys.readouterr().err == (
        f"error: --head classifier: {trained_run} holds a causal_lm model (the head it was trained with); exporting "
        "it as classifier would need a head it never trained. Drop --head, or train that stage\n")
    assert not out.exists()
    # The head it has is fine.
    assert export_cli.main(["--checkpoint", str(trained_run), "--out", str(out), "--head", "causal_lm"]) == 0


def test_step_folder_exports_that_step_without_absl_noise(tmp_path, trained_run, capfd):
    step_dir = trained_run / "checkpoints" / "1"
    assert step_dir.is_dir()
    out = tmp_path / "out"
    capfd.readouterr()
    assert export_cli.main(["--checkpoint", str(step_dir), "--out", str(out)]) == 0
    captured = capfd.readouterr()
    assert "absl" not in captured.err and "WARNING" not in captured.err, captured.err
    assert "model.safetensors.index.json" in os.listdir(out)
    assert set(weight_files(out))


def test_debug_flag_shows_the_traceback(tmp_path, hf_src):
    out = tmp_path / "out"
    out.mkdir()
    (out / "x").write_text("x")
    with pytest.raises(ValueError, match="is not empty"):
        export_cli.main(["--checkpoint", str(hf_src), "--out", str(out), "--debug"])
