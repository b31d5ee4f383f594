"""Skips are deliberate: with `--strict-skips` (scripts/test.sh passes it, so CI and the README's test command
run with it) a skipped test whose reason is not listed in tests/allowed_skips.txt fails the run.

A skip hides a test as well as a pass would, so a broken install (a torch that no longer imports, a package the
test extra dropped) must not turn into a quietly shorter suite. `-rs` (pyproject addopts) prints every skip's
reason; this plugin also names the unexpected ones in their own section and turns the exit status into 1.

Under xdist the workers forward their skipped test and collection reports to the controller, which is where the
check runs (a worker's own exit status is not the run's). Loaded from tests/conftest.py; it imports nothing
heavy, so tests can run it in a child pytest on a throwaway test file.
"""

from __future__ import annotations

import os

import pytest

ALLOWED_SKIPS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed_skips.txt")


def pytest_addoption(parser):
    parser.addoption("--strict-skips", action="store_true", default=False,
                     help="fail the run on any skip whose reason is not listed in tests/allowed_skips.txt")


def pytest_configure(config):
    if config.getoption("strict_skips") and not hasattr(config, "workerinput"):  # the controller, or no xdist
        config.pluginmanager.register(SkipPolicy(load_allowed_skips()), "longrm_skip_policy")


def load_allowed_skips(path: str = ALLOWED_SKIPS_FILE) -> set[str]:
    """The allowed reasons: one per line, matched exactly; `#` lines say why each is allowed."""
    with open(path, encoding="utf-8") as f:
        return {line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")}


def skip_reason(report) -> str:
    """The reason a skipped test or collection report carries ("Skipped: " removed)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ").strip()


class SkipPolicy:
    def __init__(self, allowed: set[str]):
        self.allowed = allowed
        self.unexpected: list[tuple[str, str]] = []

    def _see(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail reports as skipped too
            reason = skip_reason(report)
            if reason not in self.allowed:
                self.unexpected.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report):
        self._see(report)

    def pytest_collectreport(self, report):  # a module-level skip (skipif pytestmark, pytest.skip at import)
        self._see(report)

    def pytest_sessionfinish(self, session):
        # Runs inside the terminal reporter's wrapper, so before the summary below is printed.
        if self.unexpected and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if not self.unexpected:
            return
        terminalreporter.section("skips not in tests/allowed_skips.txt (--strict-skips)", sep="=", red=True)
        for nodeid, reason in self.unexpected:
            terminalreporter.line(f"{nodeid or '<collection>'}: {reason}")
        terminalreporter.line(f"{len(self.unexpected)} unexpected skip(s): the run fails. Fix the cause, or list "
                              "the reason in tests/allowed_skips.txt with why CI may skip it.")
