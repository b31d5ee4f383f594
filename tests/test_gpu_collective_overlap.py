"""The compiled 8-GPU FSDP training step (tiny Qwen3, ``h100x8`` compiled without a GPU) overlaps its collectives
with compute: every weight all-gather and gradient reduce-scatter is asynchronous, and XLA schedules compute
between each one's start and its done, in the layer loops (forward and backward) where they repeat per layer.

A regression here (a collective made synchronous, a kernel's custom call that forces a gather to complete
early) would show on a node as GPUs idle while NCCL runs (issue 40; docs/perf_training.md, "Four GPUs of one
host"). The compile needs jax's CUDA plugin, which scripts/test.sh installs beside the test environment
(LONGRM_CUDA_COMPILE_PATH) and which runs here in a subprocess, so the suite's own jax never loads it.
"""

import json
import os
import subprocess
import sys

import pytest

CUDA_PATH = os.environ.get("LONGRM_CUDA_COMPILE_PATH")
HELPER = os.path.join(os.path.dirname(__file__), "helpers", "gpu_collectives.py")
# 256-token rows: the collectives, their layer loops and the compute scheduled inside each start/done are those of
# 1,024-token rows (the same ops, within 2 fusions of each other), and the compile takes less time.
SETS = ["mesh.fsdp=8", "mesh.data=1", "data.batch_rows=8", "data.seq_len=256", "model.remat=full",
        "model.compute_dtype=bfloat16", "model.param_dtype=bfloat16", "model.overrides.num_layers=4"]

pytestmark = [
    pytest.mark.skipif(not CUDA_PATH, reason="LONGRM_CUDA_COMPILE_PATH is unset: no jax CUDA plugin to compile for GPUs"),
    pytest.mark.slow,  # one deviceless GPU compile (~30 s of CPU)
]


@pytest.fixture(scope="module")
def collectives():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([CUDA_PATH, os.environ.get("PYTHONPATH", "")]),
               JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the session's fake CPU devices and CPU flags are not the GPU program's
    cmd = [sys.executable, HELPER, "h100x8"] + [a for s in SETS for a in ("--set", s)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["gradients"]


def _compute(entry):
    return [op for op in entry["between"] if op in ("fusion", "custom-call", "dot", "while")]


def test_options_only_for_a_mesh_of_several_gpus():
    from longrm_jax.xla_flags import GPU_MESH_COMPILER_OPTIONS, gpu_mesh_compiler_options

    class Device:
        def __init__(self, platform):
            self.platform = platform

    class Mesh:
        def __init__(self, *platforms):
            import numpy as np

            self.devices = np.array([Device(p) for p in platforms], dtype=object)

    assert gpu_mesh_compiler_options(Mesh("cuda", "cuda"), environ={}) == GPU_MESH_COMPILER_OPTIONS
    assert gpu_mesh_compiler_options(Mesh("cuda"), environ={}) == {}
    assert gpu_mesh_compiler_options(Mesh("cpu", "cpu"), environ={}) == {}
    assert gpu_mesh_compiler_options(None, environ={}) == {}
    user = {"XLA_FLAGS": "--xla_gpu_enable_while_loop_double_buffering=false --xla_foo=1"}
    assert "xla_gpu_enable_while_loop_double_buffering" not in gpu_mesh_compiler_options(Mesh("gpu", "gpu"), environ=user)
    assert len(gpu_mesh_compiler_options(Mesh("gpu", "gpu"), environ=user)) == len(GPU_MESH_COMPILER_OPTIONS) - 1


def test_every_gather_and_scatter_is_asynchronous(collectives):
    moving = [e for e in collectives if e["op"] in ("all-gather", "reduce-scatter")]
    assert moving, collectives
    assert all(e["async"] for e in moving), [e for e in moving if not e["async"]]


def test_the_layer_loops_overlap_their_collectives_with_compute(collectives):
    loops = {e["computation"] for e in collectives if e["computation"] != "ENTRY"}
    backward = {e["computation"] for e in collectives if e["op"] == "reduce-scatter" and e["computation"] in loops}
    forward = loops - backward
    assert len(backward) == 1 and len(forward) == 1, collectives  # one scan over the layers each way
    for entry in collectives:
        if entry["computation"] in loops and entry["op"] in ("all-gather", "reduce-scatter"):
            assert _compute(entry), f"{entry['op']} in {entry['computation']} has no compute to hide behind"
    (bwd,), (fwd,) = backward, forward
    gathers = [e for e in collectives if e["computation"] in (fwd, bwd) and e["op"] == "all-gather"]
    scatters = [e for e in collectives if e["computation"] == bwd and e["op"] == "reduce-scatter"]
    assert {e["computation"] for e in gathers} == {fwd, bwd} and scatters, collectives
    # Each layer's weight gather (forward and backward) and gradient reduce-scatter runs behind a layer's
    # attention kernel and matmuls, not one op: in the forward that takes the pipelined gather (xla_flags.
    # GPU_MESH_XLA_FLAGS; without it 2 fusions sat between its start and done).
    assert all(len(_compute(e)) >= 4 for e in gathers + scatters), gathers + scatters
    assert any("custom-call" in e["between"] for e in gathers if e["computation"] == fwd), gathers
