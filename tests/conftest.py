"""Fixtures shared by every test area (helpers live in pd_testlib)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pd_testlib import ROOT, free_ports


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def rehearsal_inventory_copy() -> Iterator[Path]:
    """A private copy of inventory/rehearsal (links followed) whose programs get free ports, so it never
    meets a rehearsal running from the checkout. It lives in a short /tmp directory, not tmp_path: the
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
    names = ("serving_prefill_port", "serving_decode_port", "serving_bootstrap_port", "serving_router_port",
             "serving_router_metrics_port")  # fmt: skip
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    (target / "group_vars" / "all" / "zz-test-ports.yml").write_text(yaml.safe_dump(ports))
    return target
