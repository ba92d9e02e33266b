"""A host whose Python has no lock (Ubuntu 22.04's 3.10) gets a uv-managed CPython, fetched through
the mirror variable: the role installs uv from its hashed pin and runs `uv python install` with
UV_PYTHON_INSTALL_MIRROR and UV_PYTHON_INSTALL_DIR set.

No CPython build is reachable here (GitHub is not, and no mirror exists), so the test serves uv a
mirror directory and checks uv's answers: the exact archive it asks the mirror for when it is absent,
and a refused sha256 when the mirror serves other bytes under that name. A real download through a
mirror is not run.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from pd_testlib import ROOT, run_playbook

pytestmark = pytest.mark.slow

PROBE_310 = (
    '{"version": "3.10.12", "machine": "x86_64", "libc": ["glibc", "2.35"], "executable": "/x", "venv": true}'
)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("uvpy")
    tools = base / "root" / "opt" / "pd-appliance" / "tools"
    subprocess.run(["python3", "-m", "venv", str(tools)], check=True)
    python310 = base / "python3.10"
    python310.write_text(f"#!/bin/sh\necho '{PROBE_310}'\n")
    python310.chmod(0o755)
    return {"base": base, "python": python310}


def _converge(host: dict[str, Path], mirror: Path) -> str:
    inventory = host["base"] / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        '      ansible_python_interpreter: "{{ ansible_playbook_python }}"\n'
    )
    extra = {
        "appliance_root": str(host["base"] / "root"),
        "appliance_manage_user": False,
        "appliance_user": "root",
        "appliance_group": "root",
        "sglang_python": str(host["python"]),
        "sglang_uv_python_install_mirror": mirror.as_uri(),
    }
    result = run_playbook(
        ROOT / "tests" / "sglang" / "uv_python_playbook.yml", inventory, "-e", json.dumps(extra)
    )
    return " ".join((result.stdout + result.stderr).split())


def test_missing_archive_is_named_by_uv(host: dict[str, Path]) -> None:
    mirror = host["base"] / "mirror-empty"
    mirror.mkdir()
    out = _converge(host, mirror)
    assert "Python 3.12 (uv: host Python 3.10.12 has no lock (wheels exist for 3.11, 3.12))" in out
    assert (host["base"] / "root/opt/pd-appliance/tools/bin/uv").exists(), "uv from files/locks/uv.txt"
    asked = re.search(
        rf"{re.escape(str(mirror))}/(\d+)/(cpython-3\.12\.\d+\+\d+-x86_64-unknown-linux-gnu-\S+\.tar\.gz)",
        out,
    )
    assert asked, out[-3000:]
    host["asked"] = Path(asked.group(1)) / asked.group(2)  # type: ignore[assignment]


def test_other_bytes_under_that_name_are_refused(host: dict[str, Path]) -> None:
    if "asked" not in host:
        pytest.skip("needs the archive name from the previous test")
    mirror = host["base"] / "mirror-bad"
    archive = mirror / host["asked"]
    archive.parent.mkdir(parents=True)
    # A well-formed archive with the right name and other bytes: uv must refuse it by its sha256.
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("python/bin/python3.12")
        payload = b"#!/bin/sh\necho not CPython\n"
        info.size, info.mode = len(payload), 0o755
        tar.addfile(info, io.BytesIO(payload))
    out = _converge(host, mirror)
    assert re.search(r"[Hh]ash mismatch", out), out[-3000:]
    assert not list((host["base"] / "root/opt/pd-appliance/python").glob("cpython-*")), (
        "nothing was installed"
    )
