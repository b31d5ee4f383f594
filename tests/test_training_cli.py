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


@pytest.mark.slow
def test_compilation_cache_is_written_and_reused(tmp_path):
    """`compilation_cache: DIR` stores the compiled step programs; a second run of the same shapes finds them.

    JAX stores only programs that compiled in more than its threshold (1 s by default), and a program near it
    lands on either side from one run to the next on a loaded machine. With the threshold at 0 every program is
    stored, so the second run must find every one of them: nothing in the outcome depends on timing."""
    import os
    import subprocess
    import sys

    cache = tmp_path / "xla_cache"
    args = [sys.executable, "-m", "longrm_jax.train", "--set", "stage=bt", "--set", "data.seq_len=256",
            "--set", "data.batch_rows=4", "--set", "model.overrides={num_layers: 2}",
            "--set", "data.synthetic.lengths=[60]", "--set", "data.num_train=8", "--set", "steps=1",
            "--set", "eval_before=false", "--set", "eval_after=false", "--set", "tensorboard=false",
            "--set", "progress=false", "--set", "checkpoint.every=0", "--set", "checkpoint.at_end=false",
            "--set", "mesh.fsdp=1", "--set", f"compilation_cache={cache}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    for run in (1, 2):
        proc = subprocess.run(args + ["--set", f"output_dir={tmp_path / f'run{run}'}"], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        if run == 1:
            entries = set(os.listdir(cache))
            assert entries, "no compiled program was cached"
    assert set(os.listdir(cache)) == entries  # the second run wrote nothing new: it reused every entry


@pytest.mark.slow
def test_profile_window_writes_a_trace_the_summary_reads(tmp_path):
    """`profile.steps: N` traces steps [start, start + N); scripts/profile_summary.py reads the trace."""
    import glob
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    args = [sys.executable, "-m", "longrm_jax.train", "--set", "stage=bt", "--set", "data.seq_len=256",
            "--set", "data.batch_rows=2", "--set", "model.overrides={num_layers: 1}",
            "--set", "data.synthetic.lengths=[60]", "--set", "data.num_train=8", "--set", "steps=3",
            "--set", "eval_before=false", "--set", "eval_after=false", "--set", "tensorboard=false",
            "--set", "progress=false", "--set", "checkpoint.every=0", "--set", "checkpoint.at_end=false",
            "--set", "mesh.fsdp=1", "--set", "profile.start=2", "--set", "profile.steps=1",
            "--set", f"output_dir={out}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    traces = glob.glob(str(out / "profile" / "**" / "*.xplane.pb"), recursive=True)
    assert len(traces) == 1
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "profile_summary.py")
    proc = subprocess.run([sys.executable, script, str(out / "profile")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CPU-only trace" in proc.stdout


def test_eval_every_draws_the_held_out_curve_and_plots_it(tmp_path, capsys):
    """`eval_every: N`: held-out accuracy before training, at every N-th step and after it, in metrics.jsonl and on
    the console; scripts/plot_learning_curves.py draws the curve from the run directory."""
    import importlib.util
    import json
    import os

    from longrm_jax import train

    out = tmp_path / "run"
    sets = ["stage=bt", "data.seq_len=256", "data.batch_rows=2", "model.overrides={num_layers: 1}",
            "data.synthetic.lengths=[60]", "data.num_train=16", "data.num_eval=4", "steps=5", "eval_every=2",
            "tensorboard=false", "progress=false", "checkpoint.every=0", "mesh.fsdp=1", f"output_dir={out}"]
    assert train.main([a for s in sets for a in ("--set", s)]) == 0
    evals = [json.loads(line) for line in open(out / "metrics.jsonl") if '"eval"' in line]
    assert [e["step"] for e in evals] == [0, 2, 4, 5]
    assert "held-out pairwise accuracy at step 2 of training" in capsys.readouterr().out
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "plot_learning_curves.py")
    spec = importlib.util.spec_from_file_location("plot_learning_curves", script)
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    assert plot.read_curves(str(out))[2]["held-out"] == [(e["step"], e["accuracy"]) for e in evals]
    assert plot.main([str(out), "--out", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 1000
