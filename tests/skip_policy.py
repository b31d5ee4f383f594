"""Skips are deliberate: with `--strict-skips` (scripts/test.sh passes it, so CI and the README's test command
run with it) a skipped test whose reason is not listed in tests/allowed_skips.txt fails the run, and so does an
allowed reason that covers another number of tests than the file says.

A skip hides a test as well as a pass would, so a broken install (a torch that no longer imports, a package the
test extra dropped) must not turn into a quietly shorter suite. `-rs` (pyproject addopts) prints every skip's
reason; this plugin also names the unexpected ones in their own section and turns the exit status into 1.

Counts: each allowed line is `[N] reason`, N the tests that carry a `skip`/`skipif` mark with that reason, whether
or not its condition holds in this run (the upstream rows' reason said 6 where 13 tests carried it: nobody
counted). They are counted at collection, so a clone with the data and one without agree. A run fails when
- a test skips with an allowed reason without carrying its mark (a runtime `pytest.skip` hides from the count);
- more tests carry, or skip with, a reason than its N;
- the run collected whole test directories (no `file::test` argument; `-k` and `-m` deselect after counting) and
  fewer tests carry it than N.

Under xdist the workers collect and the controller runs the check: the workers forward their skipped test and
collection reports, and their mark counts through `workeroutput` (a worker's own exit status is not the run's).
Loaded from tests/conftest.py; it imports nothing heavy, so tests can run it in a child pytest on a throwaway test
file (`--allowed-skips` names another list).
"""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest

ALLOWED_SKIPS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed_skips.txt")
_LINE = re.compile(r"\[(\d+)\] (\S.*)")
_WORKER_KEY = "longrm_skip_marks"


def pytest_addoption(parser):
    parser.addoption("--strict-skips", action="store_true", default=False,
                     help="fail the run on any skip whose reason is not listed in tests/allowed_skips.txt, or on "
                          "an allowed reason carried by another number of tests than listed")
    parser.addoption("--allowed-skips", default=ALLOWED_SKIPS_FILE, help="the list --strict-skips reads")


def pytest_configure(config):
    if not config.getoption("strict_skips"):
        return
    allowed = load_allowed_skips(config.getoption("allowed_skips"))
    if hasattr(config, "workerinput"):  # an xdist worker: it collects, the controller judges
        config.pluginmanager.register(MarkCounter(allowed), "longrm_skip_marks")
    else:
        config.pluginmanager.register(SkipPolicy(allowed), "longrm_skip_policy")


def load_allowed_skips(path: str = ALLOWED_SKIPS_FILE) -> dict[str, int]:
    """The allowed reasons and how many tests carry each: one `[N] reason` per line, the reason matched exactly;
    `#` lines say why each is allowed."""
    allowed = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            match = _LINE.fullmatch(line.strip())
            if match is None:
                raise pytest.UsageError(f"{path}:{number}: expected '[N] reason' (N: the tests carrying it); "
                                        f"got {line.strip()!r}")
            allowed[match.group(2)] = int(match.group(1))
    return allowed


def skip_reason(report) -> str:
    """The reason a skipped test or collection report carries ("Skipped: " removed)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ").strip()


def marked_tests(items, allowed) -> dict:
    """The nodeids carrying a skip mark with each allowed reason, and whether whole test directories were
    collected (every test_*.py beside the collected ones, no `file::test` argument)."""
    carried: dict[str, list[str]] = {reason: [] for reason in allowed}
    for item in items:
        reasons = {m.kwargs.get("reason") for name in ("skip", "skipif") for m in item.iter_markers(name)}
        for reason in reasons & carried.keys():
            carried[reason].append(item.nodeid)
    files = {str(item.path) for item in items}
    dirs = {os.path.dirname(f) for f in files}
    beside = {os.path.join(d, n) for d in dirs for n in os.listdir(d) if n.startswith("test_") and n.endswith(".py")}
    args = items[0].config.args if items else []
    return {"carried": carried, "whole": bool(items) and beside <= files and not any("::" in a for a in args)}


class MarkCounter:
    """An xdist worker's part: its collection's marks, sent to the controller when the worker finishes."""

    def __init__(self, allowed: dict[str, int]):
        self.allowed = allowed

    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselect: the count is the code's, not this selection's
    def pytest_collection_modifyitems(self, config, items):
        config.workeroutput[_WORKER_KEY] = marked_tests(items, self.allowed)


class SkipPolicy:
    def __init__(self, allowed: dict[str, int]):
        self.allowed = allowed
        self.unexpected: list[tuple[str, str]] = []
        self.skipped: dict[str, list[str]] = {reason: [] for reason in allowed}
        self.marks: dict | None = None
        self.problems: list[str] = []

    def _see(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail reports as skipped too
            reason = skip_reason(report)
            if reason in self.allowed:
                self.skipped[reason].append(report.nodeid)
            else:
                self.unexpected.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report):
        self._see(report)

    def pytest_collectreport(self, report):  # a module-level skip (skipif pytestmark, pytest.skip at import)
        self._see(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):  # no xdist: this process collects
        self.marks = marked_tests(items, self.allowed)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):  # xdist: every worker collected the same tests
        marks = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if marks is not None and self.marks is None:
            self.marks = marks

    def count_problems(self) -> list[str]:
        problems = []
        carried = self.marks["carried"] if self.marks else None
        for reason, stated in self.allowed.items():
            skipped = self.skipped[reason]
            if carried is not None:
                unmarked = sorted(set(skipped) - set(carried[reason]))
                problems += [f"{n}: skips with {reason!r} but carries no skip mark with it (pytest.mark.skipif("
                             f"..., reason=...)), so the count misses it" for n in unmarked]
                n = len(carried[reason])
                if n > stated or (n < stated and self.marks["whole"]):
                    problems.append(f"{reason!r}: {n} tests carry it, tests/allowed_skips.txt says [{stated}]")
            if len(skipped) > stated:
                problems.append(f"{reason!r}: {len(skipped)} tests skipped with it, the list says [{stated}]")
        return problems

    def pytest_sessionfinish(self, session):
        # Runs inside the terminal reporter's wrapper, so before the summary below is printed.
        self.problems = self.count_problems()
        if (self.unexpected or self.problems) and session.exitstatus in (pytest.ExitCode.OK,
                                                                         pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.unexpected:
            terminalreporter.section("skips not in tests/allowed_skips.txt (--strict-skips)", sep="=", red=True)
            for nodeid, reason in self.unexpected:
                terminalreporter.line(f"{nodeid or '<collection>'}: {reason}")
            terminalreporter.line(f"{len(self.unexpected)} unexpected skip(s): the run fails. Fix the cause, or "
                                  "list the reason in tests/allowed_skips.txt with why CI may skip it.")
        if self.problems:
            terminalreporter.section("allowed skips counted wrong (--strict-skips)", sep="=", red=True)
            for line in self.problems:
                terminalreporter.line(line)
            terminalreporter.line("Mark each test that may skip with its reason, and set [N] in "
                                  "tests/allowed_skips.txt to the tests that carry it.")
