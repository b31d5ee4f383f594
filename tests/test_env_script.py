"""scripts/_env.sh (sourced by quickstart.sh and test.sh) says what the first install downloads, per extra: the
base install is a few hundred MB (quickstart used to announce "a few GB", the test extra's torch; issue 42 item
7)."""

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _note(extra: str) -> str:
    return subprocess.run(["bash", "-c", f'source scripts/_env.sh && install_note "{extra}"'], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_install_note_per_extra():
    base, test = _note(""), _note("test")
    assert "a few hundred MB" in base and "GB:" not in base and "torch" not in base
    assert "a few GB" in test and "torch" in test
    script = (ROOT / "scripts" / "_env.sh").read_text()
    assert "few GB)" not in script and '$(install_note "$extra")' in script
