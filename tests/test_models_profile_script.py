"""scripts/profile_model.py runs end to end on the CPU (--smoke) and reports every requested part."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_profile_model_smoke(tmp_path):
    out = tmp_path / "rows.json"
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "profile_model.py"), "--smoke", "--parts",
           "elementwise,decode", "--no-flags", "--json", str(out)]
    from conftest import xla_flags_with_devices

    # One CPU device is enough; the suite's XLA flags are kept, its LLVM level 0 among them: the smoke run checks
    # that every part is measured and reported, not how fast XLA:CPU's machine code is.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags_with_devices(1)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    parts = {r["part"] for r in rows}
    assert any(p.startswith("decode step") for p in parts) and any(p.startswith("rms_norm") for p in parts)
    assert all(r["ms"] is not None and r["ms"] > 0 for r in rows)
    assert "| decode | decode step @ 256 ctx |" in proc.stdout
