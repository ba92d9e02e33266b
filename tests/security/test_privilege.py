"""The privilege probe finds what the service user can write among root's code, and nothing else.

Run as root (CI is): a root-owned tree with one group-writable file, one world-writable file, one
world-writable directory and a sticky /tmp-like directory; the probe, dropped to `nobody`, must
report exactly the three writable paths. The converged lab host is checked by molecule/default's
verify (python -m pd_appliance.privilege against the live supervisord)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pd_appliance import privilege

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")


@pytest.fixture
def root_tree() -> Iterator[Path]:
    # Not tmp_path: pytest's base directory is 0700, so `nobody` could not even reach the tree.
    base = Path(tempfile.mkdtemp(prefix="pd-priv-", dir="/tmp"))
    base.chmod(0o755)
    (base / "venv" / "lib").mkdir(parents=True)
    (base / "venv" / "lib" / "safe.py").write_text("print('root code')\n")
    (base / "venv" / "lib" / "group.py").write_text("x = 1\n")
    (base / "venv" / "lib" / "world.py").write_text("x = 2\n")
    (base / "venv" / "open").mkdir()
    (base / "venv" / "shared").mkdir()
    (base / "venv" / "lib" / "group.py").chmod(0o664)
    (base / "venv" / "lib" / "world.py").chmod(0o666)
    (base / "venv" / "open").chmod(0o777)
    (base / "venv" / "shared").chmod(0o1777)
    nogroup = 65534
    os.chown(base / "venv" / "lib" / "group.py", 0, nogroup)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_probe_reports_exactly_what_the_user_can_write(root_tree: Path) -> None:
    code = privilege.collect(None, [], [str(root_tree / "venv")])
    sticky = {d for d in code.directories if privilege.sticky_shared(d)}
    writable = privilege.probe_as("nobody", sorted(code.files), sorted(code.directories - sticky))
    venv = root_tree / "venv"
    assert set(writable) == {
        str(venv / "lib" / "group.py"),
        str(venv / "lib" / "world.py"),
        str(venv / "open"),
    }
    assert str(venv / "shared") in sticky and "/tmp" in sticky
    assert str(venv / "lib" / "safe.py") in code.files and "/" in code.directories  # parents up to /
    # Nothing was changed by trying: contents intact, no probe file left behind.
    assert (venv / "lib" / "world.py").read_text() == "x = 2\n"
    assert not list(venv.rglob(".pd-privilege-probe-*"))


def test_cli_checks_an_interpreter_and_exits_1_naming_the_writable_path(root_tree: Path) -> None:
    cli = [sys.executable, "-m", "pd_appliance.privilege", "--user", "nobody", "--python", sys.executable]
    clean = subprocess.run(cli, capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(clean.stdout)
    assert report["tried"] > 1000 and report["files"] > 0, report["tried"]  # the whole import path was tried
    assert clean.returncode == (1 if report["writable"] else 0)

    dirty = subprocess.run(
        [*cli, "--path", str(root_tree / "venv")], capture_output=True, text=True, timeout=300, check=False
    )
    assert dirty.returncode == 1
    assert str(root_tree / "venv" / "open") in json.loads(dirty.stdout)["writable"]
