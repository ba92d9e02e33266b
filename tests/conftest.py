"""Fixtures shared by every test area (helpers live in pd_testlib)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pd_testlib import ROOT, free_ports


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def rehearsal_inventory_copy(tmp_path: Path) -> Path:
    """A private copy of inventory/rehearsal (links followed): its .rehearsal root lands under tmp_path,
    and its programs get free ports, so it never meets a rehearsal running from the checkout."""
    target = tmp_path / "inventory" / "rehearsal"
    shutil.copytree(ROOT / "inventory" / "rehearsal", target)
    names = ("serving_prefill_port", "serving_decode_port", "serving_bootstrap_port", "serving_router_port",
             "serving_router_metrics_port")  # fmt: skip
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    (target / "group_vars" / "all" / "zz-test-ports.yml").write_text(yaml.safe_dump(ports))
    return target
