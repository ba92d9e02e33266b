"""Preflight names a Python that cannot build the SGLang venv, and a bad package source, before any
change; with sglang_python_source auto the same host passes and is told it gets uv's Python.

The host's interpreter is a stand-in script answering the role's probe as Ubuntu 22.04's Python 3.10
would (this machine runs 3.11); everything else is the real preflight play on the rehearsal inventory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pd_testlib import run_playbook

pytestmark = pytest.mark.slow

UBUNTU_2204_PROBE = {
    "version": "3.10.12",
    "machine": "x86_64",
    "libc": ["glibc", "2.35"],
    "executable": "/usr/bin/python3.10",
    "venv": True,
}


@pytest.fixture
def python310(tmp_path: Path) -> Path:
    script = tmp_path / "python3.10"
    script.write_text(f"#!/bin/sh\necho '{json.dumps(UBUNTU_2204_PROBE)}'\n")
    script.chmod(0o755)
    return script


def test_host_only_python_without_a_lock_and_a_bad_index_stop_preflight(
    rehearsal_inventory_copy: Path, python310: Path
) -> None:
    extra = {
        "sglang_python": str(python310),
        "sglang_python_source": "host",
        "sglang_pip_index_url": "ftp://m/simple",
    }
    result = run_playbook("playbooks/preflight.yml", rehearsal_inventory_copy, "-e", json.dumps(extra))
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, out[-3000:]
    assert "nothing was changed" in out
    expected = "localhost: sglang_python is Python 3.10.12, but the pinned SGLang wheels exist only for"
    assert f"{expected} Python 3.11, 3.12" in out
    assert "cp310" in out and "Set sglang_python_source: uv" in out
    assert "localhost: sglang_pip_index_url=ftp://m/simple: use an https:// (or file://) URL" in out


def test_auto_gives_a_310_host_uvs_python(rehearsal_inventory_copy: Path, python310: Path) -> None:
    extra = {"sglang_python": str(python310), "sglang_uv_python_install_mirror": "http://mirror.invalid/pbs"}
    result = run_playbook("playbooks/preflight.yml", rehearsal_inventory_copy, "-e", json.dumps(extra))
    out = " ".join(result.stdout.split())
    assert result.returncode == 0, out[-3000:]
    # uv checks its CPython archives against its own sha256 list: an http mirror is allowed.
    assert (
        "SGLang venv: Python 3.12 (uv: host Python 3.10.12 has no lock (wheels exist for 3.11, 3.12))" in out
    )
