"""scripts/e2e_gpu.py runs its whole chain on the CPU with tiny shapes (--smoke): HF checkpoint written, the
training CLI killed after its first checkpoint and resumed, export, synthetic Long-RewardBench, evaluate; on a
"node" of 2 fake CPU devices (--devices 2: ring attention over seq 2, two evaluation replicas)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.timeout(900)  # its chain's own limit below (pyproject's default is 600 s)
def test_e2e_smoke_chain(tmp_path):
    from conftest import xla_flags_with_devices

    # one device per phase (the script's own choice); the suite's other XLA flags kept
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags_with_devices(None)}
    # --steps 16: the kill comes once the first checkpoint is complete (step 1 or 2) and the resume trains the rest,
    # each step saving a checkpoint (0.1-0.3 s on the CPU), so steps 3..16 still run seconds after the kill, far
    # beyond the script's 0.1 s poll; the --smoke default of 40 only adds checkpointed steps to the resume.
    proc = subprocess.run([sys.executable, os.path.join("scripts", "e2e_gpu.py"), "--smoke", "--model", "qwen3_8b",
                           "--work", str(tmp_path / "work"), "--scratch", str(tmp_path / "scratch"), "--keep",
                           "--devices", "2", "--steps", "16"], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    phases = {r["phase"]: r for r in json.loads((tmp_path / "work" / "phases.json").read_text())}
    assert list(phases) == ["write_hf", "train", "resume", "export", "data", "evaluate"]
    assert phases["train"]["killed"] and phases["resume"]["rc"] == 0
    # the steps replayed after the resume give the killed run's losses (CPU: the same program, bit for bit)
    assert phases["resume"]["resume_loss_max_rel_diff"] in (0.0, None), phases["resume"]["resume_note"]
    # --devices 2: the pair over a seq mesh of 2 fake CPU devices, evaluation by 2 replica processes
    assert "  seq: 2" in (tmp_path / "work" / "run" / "config.yaml").read_text()
    assert len(list((tmp_path / "work" / "eval" / "replicas").iterdir())) == 2
    assert (tmp_path / "work" / "eval" / "results.csv").exists()
    assert (tmp_path / "scratch" / "work" / "hf_trained" / "config.json").exists()  # HF checkpoints on --scratch
    assert "| total |" in proc.stdout


def test_the_kill_waits_for_a_complete_checkpoint_of_any_step(tmp_path):
    """The poll must not depend on seeing step 1: with keep=1 its directory goes once step 2 is saved."""
    import e2e_gpu

    ckpt = tmp_path / "checkpoints"
    assert not e2e_gpu._checkpoint_done(str(ckpt))  # training has not made the directory yet
    (ckpt / "1.orbax-checkpoint-tmp-0" / "state").mkdir(parents=True)
    assert not e2e_gpu._checkpoint_done(str(ckpt))  # a save in progress is not a checkpoint
    (ckpt / "2" / "state").mkdir(parents=True)  # step 1 already deleted (keep=1), step 2 complete
    assert e2e_gpu._checkpoint_done(str(ckpt))
