"""A playbook a test gives up on leaves nothing running (pd_testlib.run_owned)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pd_testlib import alive, run_owned


def test_a_timeout_kills_the_grandchildren_too(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # The child starts a grandchild that would outlive it (as a task worker outlives ansible-playbook).
    script = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        run_owned([sys.executable, "-c", script], timeout=3)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild), "the grandchild outlived the test that gave up on its parent"


def test_a_finished_command_returns_its_output() -> None:
    done = run_owned(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], 30
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
