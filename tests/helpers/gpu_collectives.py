"""Compile the tiny training step for a GPU topology without a GPU and describe its collectives, as JSON on
stdout: for every asynchronous collective (``*-start`` ... ``*-done``), the computation it sits in and the
compute ops (fusions, custom calls, matmuls, loops) XLA scheduled between its start and its done.

    PYTHONPATH=$LONGRM_CUDA_COMPILE_PATH python tests/helpers/gpu_collectives.py h100x8 [--set k=v ...]

Needs jax's CUDA plugin (``jax-cuda13-plugin`` / ``jax-cuda13-pjrt``; no NVIDIA libraries, no GPU): scripts/test.sh
installs it beside the test environment and tests/test_gpu_collective_overlap.py runs this in a subprocess.
"""

import json
import os
import re
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")
COMPUTE = ("fusion", "custom-call", "dot", "convolution", "while", "call")
_OP = re.compile(r"^\s*(?:ROOT )?(%\S+) = .*? ([a-z][a-z0-9-]*)\((.*)$")


def describe(hlo: str) -> list[dict]:
    """One entry per collective of the HLO module text."""
    out = []
    for block in re.split(r"\n(?=\S[^\n]*\{\n)", hlo):
        computation = block.split(" ", 1)[0]
        lines = block.split("\n")
        for i, line in enumerate(lines):
            m = _OP.match(line)
            if not m:
                continue
            name, op, rest = m.groups()
            base = op.removesuffix("-start")
            if base not in COLLECTIVES or op.endswith("-done"):
                continue
            entry = {"op": base, "computation": computation, "async": op.endswith("-start"), "between": []}
            if entry["async"]:
                for later in lines[i + 1:]:
                    n = _OP.match(later)
                    if not n:
                        continue
                    if n.group(2) == f"{base}-done" and re.search(re.escape(name) + r"\b", n.group(3)):
                        break
                    if n.group(2) in COMPUTE:
                        entry["between"].append(n.group(2))
            out.append(entry)
    return out


def main(argv: list[str]) -> int:
    from longrm_jax.xla_flags import GPU_MESH_XLA_FLAGS, add_gpu_xla_flags

    add_gpu_xla_flags(GPU_MESH_XLA_FLAGS)  # as the training CLI sets them for a GPU topology, before the backend
    from longrm_jax.parallel.topology import parse
    from longrm_jax.train import DEFAULT_CONFIG
    from longrm_jax.training import compile_only
    from longrm_jax.training.config import load_config

    plans = []
    plan_train_step = compile_only.plan_train_step
    compile_only.plan_train_step = lambda *a, **k: plans.append(plan_train_step(*a, **k)) or plans[-1]
    sets = [a for a in argv[1:] if a != "--set"]
    cfg = load_config(None, sets, base=DEFAULT_CONFIG)
    report = compile_only.compile_train_step(cfg, parse(argv[0]))
    if not report.fits:
        print(report.error, file=sys.stderr)
        return 1
    programs = {name: describe(c.as_text()) for name, c in plans[-1].step.programs}
    print(json.dumps(programs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
