"""scripts/tiny_judge.sh finds the project's interpreter by itself: the .venv that scripts/quickstart.sh made (a
fresh shell has not activated it; the python on PATH then lacked the project: "No module named 'tokenizers'",
rc 1), and refuses in one line, before any step, an interpreter without the project."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_interpreter_without_the_project_is_refused_before_any_step(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": str(bare / "bin" / "python")}
    done = subprocess.run(["bash", "scripts/tiny_judge.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "cannot import the project" in done.stderr and "bash scripts/quickstart.sh" in done.stderr
    assert "== data" not in done.stdout  # refused before the first step

