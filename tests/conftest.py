"""Fixtures shared by every test area (helpers live in pd_testlib)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pd_testlib import ROOT


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def rehearsal_inventory_copy(tmp_path: Path) -> Path:
    """A private copy of inventory/rehearsal; its .rehearsal root lands under tmp_path, not the checkout."""
    target = tmp_path / "inventory" / "rehearsal"
    shutil.copytree(ROOT / "inventory" / "rehearsal", target)
    return target
