"""The persistent compilation cache that evaluate, score and serve use by default (longrm_jax.compile_cache): where
`auto` points, `off`, a directory, and a home that cannot hold it. (That JAX stores a program there and a second
run reads it back instead of compiling: tests/test_training_cli.py::test_compilation_cache_is_written_and_reused.)"""

import logging
import os

import jax
import pytest

from longrm_jax import compile_cache
from longrm_jax.compile_cache import cache_dir, enable_compilation_cache


def test_auto_is_jax_s_variable_else_the_user_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert cache_dir("auto") == str(tmp_path / "jax")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("auto") == str(tmp_path / "xdg" / "longrm_jax" / "xla")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir("auto") == str(tmp_path / "home" / ".cache" / "longrm_jax" / "xla")
    assert cache_dir("~/mine") == str(tmp_path / "home" / "mine")
    assert cache_dir("off") is None and cache_dir(None) is None


def test_enable_points_jax_at_the_directory_and_off_turns_it_off(monkeypatch, tmp_path):
    updates = {}
    monkeypatch.setattr(jax.config, "update", lambda name, value: updates.__setitem__(name, value))
    assert enable_compilation_cache(str(tmp_path / "c")) == str(tmp_path / "c")
    assert updates == {"jax_compilation_cache_dir": str(tmp_path / "c")} and (tmp_path / "c").is_dir()
    updates.clear()
    assert enable_compilation_cache("off") is None
    assert updates == {"jax_enable_compilation_cache": False}


def test_a_home_that_cannot_hold_the_cache_costs_a_warning_not_the_run(monkeypatch, tmp_path, caplog):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(a_file))
    updates = {}
    monkeypatch.setattr(jax.config, "update", lambda name, value: updates.__setitem__(name, value))
    with caplog.at_level(logging.WARNING, logger=compile_cache.__name__):
        assert enable_compilation_cache("auto") is None
    assert "no compilation cache" in caplog.text and updates == {}
    with pytest.raises(OSError):  # a directory the user named must be usable
        enable_compilation_cache(str(a_file / "sub"))


def test_evaluate_score_and_serve_cache_by_default():
    from longrm_jax.evaluate import read_config
    from longrm_jax.score import ScoreConfig
    from longrm_jax.serving.config import ServeConfig

    assert read_config(["--model-path", "m", "--data-path", "d"]).compilation_cache == "auto"
    assert ScoreConfig().compilation_cache == "auto" and ServeConfig().compilation_cache == "auto"
    assert os.path.basename(cache_dir("auto")) in ("xla", os.path.basename(os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                                                                          "xla")))
