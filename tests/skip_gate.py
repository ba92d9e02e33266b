"""No unseen skip: every skipped test is listed at the end of the run, and with
PD_FAIL_ON_UNDECLARED_SKIP=1 (`make pytest`, so CI) a skip that tests/declared_skips.yml does not declare
fails the session.

Why: a CI set-up step that fails (dockerd down, promtool or a wheel missing, not root) used to turn the
tests that need it into skips and the run stayed green, so a claim went unproven with nobody told. Only
tests that cannot run on the CI machine at all (a real GPU) are declared, each with the skip reason it
must give; a declared test skipping for another reason is undeclared. Developers' targeted runs leave the
variable unset and only see the list.

Loaded by tests/conftest.py (pytest_plugins); under xdist it acts in the controller, which receives
every worker's reports.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

DECLARED_FILE = Path(__file__).with_name("declared_skips.yml")
ENV = "PD_FAIL_ON_UNDECLARED_SKIP"


@dataclass(frozen=True)
class Declared:
    """One declared skip: node ids matching `pattern` may skip, only with a reason containing `because`."""

    pattern: str
    because: str
    why: str

    def covers(self, nodeid: str, reason: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.pattern) and self.because in reason


def load_declared(path: Path = DECLARED_FILE) -> list[Declared]:
    """The declared skips; a malformed entry is an error here, not a silently wider allowance."""
    entries = yaml.safe_load(path.read_text()) or []
    declared = []
    for entry in entries:
        if set(entry) != {"pattern", "because", "why"} or not all(
            isinstance(v, str) and v for v in entry.values()
        ):
            raise ValueError(
                f"{path}: each entry needs exactly pattern, because and why (non-empty): {entry}"
            )
        declared.append(Declared(**entry))
    return declared


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The skip's message: longrepr is (path, line, 'Skipped: <reason>') for a skip."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class SkipGate:
    """Collects (node id, reason) of every skip; fails the session on undeclared ones when enforcing."""

    def __init__(self, declared: list[Declared], enforce: bool) -> None:
        self.declared = declared
        self.enforce = enforce
        self.skips: list[tuple[str, str]] = []

    def _record(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append((report.nodeid, _reason(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def undeclared(self) -> list[tuple[str, str]]:
        return [(n, r) for n, r in self.skips if not any(d.covers(n, r) for d in self.declared)]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.enforce and self.undeclared() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.skips:
            return
        undeclared = self.undeclared()
        terminalreporter.section(f"skips: {len(self.skips)}, undeclared: {len(undeclared)}")
        for nodeid, reason in self.skips:
            mark = "UNDECLARED" if (nodeid, reason) in undeclared else "declared"
            terminalreporter.line(f"{mark:10} {nodeid}: {reason}")
        if undeclared and self.enforce:
            terminalreporter.line(
                f"{ENV}=1: {len(undeclared)} skip(s) not declared in {DECLARED_FILE.name}; make the test "
                "run here (install what it needs) or declare it with the reason it cannot.",
                red=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller sees its reports
        return
    enforce = os.environ.get(ENV, "") == "1"
    config.pluginmanager.register(SkipGate(load_declared(), enforce), "pd-skip-gate")
