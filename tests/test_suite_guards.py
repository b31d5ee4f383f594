"""The suite's own guards: a skip not in tests/allowed_skips.txt fails a `--strict-skips` run (scripts/test.sh),
with and without xdist, and the Qwen3-like test tokenizer cache is complete for every process that shares it."""

import os
import subprocess
import sys
import textwrap

import pytest

import skip_policy

TESTS = os.path.dirname(os.path.abspath(__file__))
ALLOWED = skip_policy.load_allowed_skips()


def _pytest(tmp_path, source: str, *args: str, nodeid: str = "") -> subprocess.CompletedProcess:
    """A child pytest on one throwaway test file, with this suite's skip policy loaded and nothing else of it
    (its rootdir is tmp_path: no pyproject options, no conftest)."""
    (tmp_path / "test_case.py").write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])),
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    cmd = [sys.executable, "-m", "pytest", "-p", "skip_policy", "-p", "no:cacheprovider", "-rs", *args,
           "test_case.py" + nodeid]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_allow_list_is_short_and_says_why():
    assert 0 < len(ALLOWED) <= 5
    with open(skip_policy.ALLOWED_SKIPS_FILE, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for reason, count in ALLOWED.items():  # a comment right above each reason
        assert lines[lines.index(f"[{count}] {reason}") - 1].startswith("#"), reason


UNLISTED = """
    import pytest

    def test_runs():
        pass

    def test_skipped():
        pytest.skip("some reason nobody listed")
"""


def test_an_unlisted_skip_fails_a_strict_run_and_is_named(tmp_path):
    proc = _pytest(tmp_path, UNLISTED, "--strict-skips")
    assert proc.returncode == 1, proc.stdout
    assert "test_case.py::test_skipped: some reason nobody listed" in proc.stdout
    assert "1 unexpected skip(s)" in proc.stdout
    assert _pytest(tmp_path, UNLISTED).returncode == 0  # without --strict-skips a skip is only reported (-rs)


MARKED = """
    import pytest

    data_missing = pytest.mark.skipif({missing}, reason="data missing")

    @data_missing
    def test_a():
        pass

    @data_missing
    @pytest.mark.parametrize("i", [1, 2])
    def test_b(i):
        pass

    def test_c():
        pass
"""


@pytest.mark.parametrize("missing, xdist", [(True, ()), (False, ("-p", "xdist.plugin", "-n", "2"))],
                         ids=["skipping-serial", "not-skipping-xdist"])
def test_each_allowed_reason_counts_the_tests_that_carry_it(tmp_path, missing, xdist):
    """3 tests carry the reason whether or not its condition holds: [3] passes, with or without the data (the
    xdist controller gets the workers' counts); [2] and [4] fail naming both counts (the list once said 6 where
    13 tests carried one)."""
    source = MARKED.format(missing=missing)
    for count, code in ((3, 0), (4, 1)) + (() if xdist else ((2, 1),)):  # xdist's children take 2 s each
        (tmp_path / "allowed.txt").write_text(f"# why\n[{count}] data missing\n")
        proc = _pytest(tmp_path, source, "--strict-skips", "--allowed-skips", "allowed.txt", *xdist)
        assert proc.returncode == code, (count, proc.stdout + proc.stderr)
        assert ("'data missing': 3 tests carry it, tests/allowed_skips.txt says" in proc.stdout) == bool(code)
        assert ("3 skipped" in proc.stdout) == missing, proc.stdout
    if xdist:
        return
    # A part of the suite (one test named) may carry fewer than listed, never more.
    proc = _pytest(tmp_path, source, "--strict-skips", "--allowed-skips", "allowed.txt", *xdist, nodeid="::test_a")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_runtime_skip_with_an_allowed_reason_fails_as_uncounted(tmp_path):
    (tmp_path / "allowed.txt").write_text("[0] data missing\n")
    proc = _pytest(tmp_path, """
        import pytest

        def test_skipped():
            pytest.skip("data missing")
    """, "--strict-skips", "--allowed-skips", "allowed.txt")
    assert proc.returncode == 1, proc.stdout
    assert "test_case.py::test_skipped: skips with 'data missing' but carries no skip mark" in proc.stdout
    assert "unexpected" not in proc.stdout


def test_a_list_line_without_its_count_is_refused(tmp_path):
    (tmp_path / "allowed.txt").write_text("data missing\n")
    proc = _pytest(tmp_path, "def test_a():\n    pass\n", "--strict-skips", "--allowed-skips", "allowed.txt")
    assert proc.returncode == 4 and "allowed.txt:1: expected '[N] reason'" in proc.stderr, proc.stderr


def test_a_module_skipped_at_import_fails_a_strict_xdist_run(tmp_path):
    """What an importorskip of a broken package did: the whole module vanished at collection. Under xdist the
    workers' collection reports reach the controller, which fails the run."""
    proc = _pytest(tmp_path, """
        import pytest

        pytest.skip("a package failed to import", allow_module_level=True)

        def test_never_collected():
            pass
    """, "--strict-skips", "-p", "xdist.plugin", "-n", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "a package failed to import" in proc.stdout and "1 unexpected skip(s)" in proc.stdout


def test_a_failing_run_keeps_its_exit_status(tmp_path):
    proc = _pytest(tmp_path, UNLISTED + """
    def test_fails():
        assert False
""", "--strict-skips")
    assert proc.returncode == 1 and "1 failed" in proc.stdout


_RACER = """
import os, sys, time
sys.path.insert(0, {tests!r})
import qwen3_like_tokenizer

def slow_build(out):  # the files appear one by one, as save_pretrained writes them
    with open(os.path.join({root!r}, "builds.log"), "a") as f:
        f.write("build\\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        with open(os.path.join(out, name), "w") as f:
            f.write(name)
        time.sleep(0.5)

while not os.path.exists(os.path.join({root!r}, "go")):  # start both racers together
    time.sleep(0.01)
path = qwen3_like_tokenizer.cached({root!r}, build_fn=slow_build)
print(sorted(os.listdir(path)))
"""


def test_tokenizer_cache_is_complete_for_two_racing_processes(tmp_path):
    """Two processes (two xdist workers on a clean clone) ask for the tokenizer at once: one builds, the other
    waits, and each gets the directory with every file. (The old cache declared the directory ready as soon as
    tokenizer.json existed, while the rest was still being written.)"""
    root = tmp_path / "cache"
    root.mkdir()
    code = _RACER.format(tests=TESTS, root=str(root))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    (root / "go").touch()
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "['chat_template.jinja', 'tokenizer.json', 'tokenizer_config.json']"
    assert (root / "builds.log").read_text() == "build\n"  # built once
    assert sorted(os.listdir(root)) == ["build.lock", "builds.log", "go", "tokenizer"]  # no temporary left


def test_tokenizer_cache_ignores_a_build_that_died(tmp_path):
    import qwen3_like_tokenizer

    def dies(out):
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            f.write("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        qwen3_like_tokenizer.cached(str(tmp_path), build_fn=dies)
    assert not (tmp_path / "tokenizer").exists()

    def builds(out):
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            f.write("whole")

    path = qwen3_like_tokenizer.cached(str(tmp_path), build_fn=builds)
    assert open(os.path.join(path, "tokenizer.json")).read() == "whole"


def test_a_hung_test_fails_alone_under_xdist(tmp_path, request):
    """The per-test limit (pyproject: pytest-timeout, 600 s, thread method) is on in this run, and a test that
    never returns fails by itself while the rest of an xdist run goes on."""
    assert request.config.pluginmanager.hasplugin("timeout"), "pytest-timeout (test extra) is not installed"
    assert float(request.config.getini("timeout")) == 600 and request.config.getini("timeout_method") == "thread"
    proc = _pytest(tmp_path, """
        import time
        import pytest

        @pytest.mark.timeout(2)
        def test_hangs():
            time.sleep(600)

        @pytest.mark.parametrize("i", range(4))
        def test_runs(i):
            pass
    """, "-p", "xdist.plugin", "-p", "pytest_timeout", "-o", "timeout_method=thread", "-n", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 4 passed" in proc.stdout and "crashed while running 'test_case.py::test_hangs'" in proc.stdout
