"""Shared fixtures: paths, and running ansible-playbook from the checkout's venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def ansible_env() -> dict[str, str]:
    """Environment for ansible-playbook: this venv first on PATH, the checkout's ansible.cfg."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    return env


def run_playbook(playbook: str | Path, inventory: str | Path, *args: str, timeout: int = 900):
    """Run ansible-playbook from the checkout and return the CompletedProcess (never raises on rc)."""
    binary = Path(sys.executable).parent / "ansible-playbook"
    cmd = [str(binary) if binary.exists() else "ansible-playbook", str(playbook), "-i", str(inventory), *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def rehearsal_inventory_copy(tmp_path: Path) -> Path:
    """A private copy of inventory/rehearsal; its .rehearsal root lands under tmp_path, not the checkout."""
    target = tmp_path / "inventory" / "rehearsal"
    shutil.copytree(ROOT / "inventory" / "rehearsal", target)
    return target
