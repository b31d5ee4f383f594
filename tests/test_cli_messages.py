"""Exact messages a new user meets: program names in --help, a tokenizer path that does not exist (no Hub
lookup), the one-line error of every CLI, and the warning when a GPU lacks tokamax."""

import logging

import pytest

from longrm_jax import cli_support
from longrm_jax.data import inspect_data as inspect_cli
from longrm_jax.data import synthetic
from longrm_jax.parallel.target import Target


@pytest.mark.parametrize("module, prog", [(inspect_cli, "python -m longrm_jax.data.inspect_data"),
                                          (synthetic, "python -m longrm_jax.data.synthetic")])
def test_help_names_the_module(module, prog, capsys):
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith(f"usage: {prog} ") and "--debug" in out


def test_missing_tokenizer_dir_is_reported_without_network(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the Hub must not be asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    data = tmp_path / "d.jsonl"
    data.write_text('{"chat_template": [{"role": "user", "content": "q"}], "chosen": "a", "rejects": ["b"]}\n')
    assert inspect_cli.main(["--data", str(data), "--tokenizer", "DIR"]) == 2
    assert capsys.readouterr().err == ("error: tokenizer directory DIR does not exist (a local model or tokenizer "
                                       "directory is needed; the bundled tiny tokenizer is "
                                       "longrm_jax/assets/tiny_tokenizer)\n")


def test_run_cli_one_line_and_debug(monkeypatch, capsys):
    def body(argv):
        raise KeyError("model/layers/q_proj")

    assert cli_support.run_cli(body, []) == 1
    assert capsys.readouterr().err == "error: KeyError: model/layers/q_proj\n"

    def multi(argv):
        raise ValueError("first line\nsecond line")

    assert cli_support.run_cli(multi, []) == 1
    assert capsys.readouterr().err == "error: first line | second line\n"
    with pytest.raises(ValueError):
        cli_support.run_cli(multi, ["--debug"])
    monkeypatch.setenv("LONGRM_DEBUG", "1")
    with pytest.raises(ValueError):
        cli_support.run_cli(multi, [])


def test_gpu_without_tokamax_warns_once_naming_the_extra(monkeypatch, caplog):
    import importlib

    from longrm_jax.ops import flash

    attention = importlib.import_module("longrm_jax.ops.dispatch")  # where the kernel choice lives

    monkeypatch.setattr(attention, "target_of", lambda *a: Target("gpu", "NVIDIA H100", 9.0))
    monkeypatch.setattr(flash, "hybrid_available", lambda *a: False)
    monkeypatch.setattr(flash, "tokamax_available", lambda: False)
    monkeypatch.setattr(flash, "tokamax_unavailable_reason", lambda: "not installed")
    attention.warn_missing_tokamax.cache_clear()
    with caplog.at_level(logging.WARNING, logger="longrm_jax.ops.slow_paths"):
        assert attention.local_impl("auto") == "cudnn"
        assert attention.local_impl("auto") == "cudnn"
    attention.warn_missing_tokamax.cache_clear()
    messages = [r.getMessage() for r in caplog.records if r.name == "longrm_jax.ops.slow_paths"]
    assert messages == ["slow path (tokamax_import): tokamax is not installed: attention on this GPU falls back from "
                        "the 'pallas' kernel to 'cudnn' (slower). Fix: install the GPU extra: pip install "
                        "\"longrm_jax[gpu]\""]
