"""The same config, seed and data on the same machine train bit-identical losses whatever the working directory,
``output_dir`` and data file name, in this process or a fresh one: each stage of the tiny judge recipe (SFT, which
the needle LM and the judge's stage 1 run; SimPO; Bradley-Terry). The runs in the fresh process are started from
another working directory, with the data copied under another name."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from longrm_jax import train
from longrm_jax.data import synthetic
from longrm_jax.data.tiny_tokenizer import TINY_JUDGE_TOKENIZER_DIR

STAGES = {"sft": "judge_sft_train.jsonl", "simpo": "judge_train.jsonl", "bt": "disrm_train.jsonl"}


def _argv(stage: str, data_name: str, out: str) -> list[str]:
    sets = [f"stage={stage}", "model.preset=tiny_llama", "model.overrides={num_layers: 1}", f"output_dir={out}",
            f"data.source={data_name}", f"data.tokenizer={TINY_JUDGE_TOKENIZER_DIR}", "data.seq_len=512",
            "data.batch_rows=4", "steps=6", "log_every=1", "progress=false", "tensorboard=false", "eval_before=false",
            "eval_after=false", "mesh.data=1", "mesh.fsdp=1", "checkpoint.every=3", "optim.lr=1e-3"]
    return [a for s in sets for a in ("--set", s)]


def _losses(run_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"train"' in line]


@pytest.mark.slow
def test_every_stage_trains_the_same_losses_from_another_directory_and_process(tmp_path, monkeypatch):
    data = tmp_path / "data"
    assert synthetic.main(["--out", str(data), "--judge", "--lengths", "32", "--num-train", "64", "--num-eval", "8",
                           "--bench-per-task", "1", "--bench-bon-fraction", "0"]) == 0
    here, there = tmp_path / "here", tmp_path / "there" / "deeper"
    here.mkdir()
    there.mkdir(parents=True)
    want = {}
    for stage, name in STAGES.items():
        shutil.copy(data / name, here / "rows.jsonl")
        monkeypatch.chdir(here)
        assert train.main(_argv(stage, "rows.jsonl", f"run_{stage}")) == 0
        want[stage] = _losses(here / f"run_{stage}")
        assert len(want[stage]) == 6
        shutil.copy(data / name, there / f"{stage}_other_name.jsonl")
    script = ("import sys\nfrom longrm_jax import train\nfrom test_training_determinism import STAGES, _argv\n"
              "for stage in STAGES:\n"
              "    assert train.main(_argv(stage, f'{stage}_other_name.jsonl', f'elsewhere_{stage}')) == 0\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], cwd=there, env=env, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for stage in STAGES:
        assert _losses(there / f"elsewhere_{stage}") == want[stage], stage
