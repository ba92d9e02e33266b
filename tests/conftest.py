"""Fixtures shared by every test area (helpers live in pd_testlib)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pd_testlib import ROOT, private_artifacts, rehearsal_ports

# Lists every skip at the end of the run; fails it on an undeclared one when CI asks (skip_gate.py).
pytest_plugins = ["skip_gate"]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def rehearsal_inventory_copy() -> Iterator[Path]:
    """A private copy of inventory/rehearsal (links followed) whose programs get reserved ports and
    whose controller-side artifacts stay under its base, so it never meets a rehearsal running from the
    checkout or another test. It lives in a short /tmp directory, not tmp_path: the
    copy's supervisor socket (<base>/.rehearsal/root/run/pd-appliance/supervisor.sock) must fit the
    107 bytes of an AF_UNIX path, and pytest's tmp_path names alone can take 60 (preflight refuses it)."""
    base = Path(tempfile.mkdtemp(prefix="pd-", dir="/tmp"))
    try:
        yield _copy_rehearsal_inventory(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _copy_rehearsal_inventory(base: Path) -> Path:
    target = base / "inventory" / "rehearsal"
    shutil.copytree(ROOT / "inventory" / "rehearsal", target)
    overlay = {**rehearsal_ports(), **private_artifacts(base)}
    (target / "group_vars" / "all" / "zz-test-ports.yml").write_text(yaml.safe_dump(overlay))
    return target


# The longest test files, longest first (measured: `pytest --durations`). With `make pytest`'s
# `-n 2 --dist loadfile`, xdist hands out files in collection order; starting these first keeps a
# ten-minute file from being the last to start on one worker while the other sits idle.
LONGEST_FIRST = (
    "tests/releases/test_release_rehearsal.py",
    "tests/foundation/test_site_modes.py",
    "tests/serving/test_topology_rehearsal.py",
    "tests/containers/test_lab_failures.py",
    "tests/security/test_secrets.py",
    "tests/serving/test_rehearsal_serving.py",
    "tests/sglang/test_provision_rehearsal.py",
    "tests/sglang/test_server_args.py",
    "tests/faults/test_faults.py",
    "tests/monitoring/test_monitor_rehearsal.py",
    "tests/validation/test_ab_rehearsal.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first, in LONGEST_FIRST's order; the rest keep their order (a stable sort)."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)
