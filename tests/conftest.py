"""Fixtures shared by every test area (helpers live in pd_testlib)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from converged_site import SHARING_FILES, XDIST_GROUP, ConvergedSite, converge
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


@pytest.fixture(scope="session")
def converged_site() -> Iterator[ConvergedSite]:
    """The whole site.yml converged once for the tests that read it (tests/converged_site.py)."""
    with converge() as site:
        yield site


def _copy_rehearsal_inventory(base: Path) -> Path:
    target = base / "inventory" / "rehearsal"
    shutil.copytree(ROOT / "inventory" / "rehearsal", target)
    overlay = {**rehearsal_ports(), **private_artifacts(base)}
    (target / "group_vars" / "all" / "zz-test-ports.yml").write_text(yaml.safe_dump(overlay))
    return target


# Files that share a module-level or session-level setup run on one xdist worker: with `--dist
# loadfile` (make pytest) the scheduler below treats each group as one file; every other file is a
# group of its own.
SHARED_GROUPS = {
    **dict.fromkeys(SHARING_FILES, XDIST_GROUP),
    # test_model_resolution imports test_server_args' rendered command lines and parser venv.
    "tests/sglang/test_server_args.py": "sglang-parser",
    "tests/sglang/test_model_resolution.py": "sglang-parser",
}

# The longest groups, longest first (measured: `pytest --durations`). xdist hands out groups in
# collection order; starting these first keeps a ten-minute group from being the last to start on
# one worker while the other sits idle.
LONGEST_FIRST = (
    XDIST_GROUP,
    "tests/releases/test_release_rehearsal.py",
    "tests/serving/test_fleet_rehearsal.py",
    "tests/validation/test_ab_rehearsal.py",
    "tests/serving/test_topology_rehearsal.py",
    "tests/serving/test_aggregated_rehearsal.py",
    "tests/validation/test_topology_choice_rehearsal.py",
    "sglang-parser",
    "tests/containers/test_lab_failures.py",
    "tests/serving/test_rehearsal_serving.py",
    "tests/faults/test_faults.py",
    "tests/monitoring/test_monitor_rehearsal.py",
)


def _group(item: pytest.Item) -> str:
    path = item.nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(path, path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile`, with the files of a SHARED_GROUPS group handed to one worker as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupedFileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return GroupedFileScheduling(config, log)


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(path, path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest groups first, in LONGEST_FIRST's order; the rest keep their order (a stable
    sort), and a group's tests stay together."""
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_group(item.nodeid), index)

    def rank(item: pytest.Item) -> tuple[int, int]:
        group = _group(item.nodeid)
        listed = LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)
        return (listed, first_seen[group])

    items.sort(key=rank)
