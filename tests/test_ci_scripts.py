"""scripts/elapsed.py and scripts/timed-targets.sh: a failed scenario says why at the end of the log.

CI keeps only the tail of what `.ci/run` prints, and the molecule scenarios run at once, so a
scenario that fails early is followed by minutes of another's output. These tests run the scripts
on a command that prints what a failed molecule step prints and check that the lines naming the
failed task and its error come last.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What molecule 25 prints around a failed task (colours included), shortened.
FAILED_SCENARIO = textwrap.dedent(
    """\
    \x1b[2m│\x1b[0m TASK [Assert the stop lost nothing in flight] *******************
    \x1b[2m│\x1b[0m fatal: [pdlab-host]: FAILED! => {"msg": "2 requests failed in flight"}
    \x1b[2m│\x1b[0m
    \x1b[2m│\x1b[0m PLAY RECAP *********************************************************
    \x1b[2m│\x1b[0m pdlab-host : ok=12 changed=1 unreachable=0 failed=1 skipped=0
    \x1b[2m└─ Return code: 2 ─────────────────────\x1b[0m
    INFO     default ➜ side_effect: Executed: Failed
    """
)


def run_elapsed(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PD_FAILURE_DIR": str(tmp_path / "failures")}
    command = [sys.executable, str(ROOT / "scripts/elapsed.py"), "--label", "default", "sh", "-c", script]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=30)


def test_a_failed_command_leaves_its_failed_task_and_error(tmp_path: Path) -> None:
    (tmp_path / "out.txt").write_text(FAILED_SCENARIO + "some later line\n" * 50)
    result = run_elapsed(tmp_path, f"cat {tmp_path / 'out.txt'}; exit 2")
    assert result.returncode == 2
    assert "[default " in result.stdout.splitlines()[0]
    summary = (tmp_path / "failures/default.txt").read_text()
    lines = summary.splitlines()
    assert lines[0] == "default: exit 2"
    assert lines[1].strip() == "TASK [Assert the stop lost nothing in flight]"
    assert "2 requests failed in flight" in lines[2]
    assert "side_effect: Executed: Failed" in summary
    assert "\x1b" not in summary and "│" not in summary


def test_a_command_that_succeeds_leaves_no_summary(tmp_path: Path) -> None:
    result = run_elapsed(tmp_path, "echo 'fatal: not really'; exit 0")
    assert result.returncode == 0
    assert not (tmp_path / "failures").exists()


def test_a_failure_without_a_task_keeps_its_last_lines(tmp_path: Path) -> None:
    result = run_elapsed(tmp_path, "echo first; echo 'docker: no such image'; exit 3")
    assert result.returncode == 3
    summary = (tmp_path / "failures/default.txt").read_text().splitlines()
    assert summary == ["default: exit 3", "  first", "  docker: no such image"]


def test_timed_targets_prints_why_after_the_time_table(tmp_path: Path) -> None:
    makefile = tmp_path / "Makefile"
    elapsed = ROOT / "scripts/elapsed.py"
    failing = "sh -c 'echo \"fatal: [h]: FAILED! => boom\"; exit 2'"
    makefile.write_text(f"ok:\n\ttrue\nscenario:\n\t{sys.executable} {elapsed} --label multi {failing}\n")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts/timed-targets.sh"), "ok", "scenario", "ok"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    tail = result.stdout.splitlines()
    table_at = tail.index("== time per target")
    assert "  (stopped: make scenario failed with status 2)" in tail[table_at:]
    why_at = tail.index("== why it failed (the full lines are above)")
    assert why_at > table_at
    assert tail[why_at + 1 :] == ["multi: exit 2", "  fatal: [h]: FAILED! => boom"]
