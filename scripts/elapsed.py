#!/usr/bin/env python3
"""Run a command and prefix each line it prints with the seconds since it started (and a label).

    scripts/elapsed.py [--label NAME] COMMAND [ARG...]

make's molecule targets run through it, so a CI log shows what each molecule step (create,
converge, idempotence, check, verify, side_effect, ...) took, the table in docs/molecule.md, and
the lines of scenarios that run at once can be told apart. Exits with the command's status.

When the command fails and PD_FAILURE_DIR is set, a few lines saying why (the failed task, its
error, the molecule step) go to PD_FAILURE_DIR/NAME.txt: scripts/timed-targets.sh prints them
last, because CI keeps only the tail of a log and the scenarios that run at once go on printing
long after one of them failed.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Box drawing molecule 25 frames ansible's output with ("│ ", "└─").
FRAME = re.compile(r"^[\s│└─┌]*")
FAILED_TASK = re.compile(r"^(fatal:|failed:|FAILED - |ERROR!|An exception occurred)")
FAILED_STEP = re.compile(r"Executed: Failed|CRITICAL|Return code: [1-9]")
KEPT_LINES = 2000
SUMMARY_LINES = 14
SUMMARY_WIDTH = 600


def plain(line: str) -> str:
    """The line as a reader sees it: no colours, no molecule frame, no trailing blanks."""
    return FRAME.sub("", ANSI.sub("", line)).rstrip()


def failure_summary(lines: list[str]) -> list[str]:
    """The last failed task (its TASK line and error) and the molecule steps that failed."""
    text = [plain(line) for line in lines]
    summary: list[str] = []
    failed_at = next((i for i in range(len(text) - 1, -1, -1) if FAILED_TASK.match(text[i])), None)
    if failed_at is not None:
        task = next((text[i] for i in range(failed_at, -1, -1) if text[i].startswith("TASK [")), "")
        summary += [task.rstrip("* ")] if task else []
        summary += [line for line in text[failed_at : failed_at + 6] if line]
    summary += [line for line in text if FAILED_STEP.search(line)][-4:]
    if not summary:
        summary = [line for line in text if line][-SUMMARY_LINES:]
    return [line[:SUMMARY_WIDTH] for line in summary[:SUMMARY_LINES]]


def write_failure(label: str, status: int, lines: list[str]) -> None:
    """Leave the summary where timed-targets.sh looks for it, when CI asked for one."""
    directory = os.environ.get("PD_FAILURE_DIR")
    if not directory:
        return
    name = label.strip() or "command"
    path = Path(directory) / f"{name}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = [f"{name}: exit {status}", *(f"  {line}" for line in failure_summary(lines))]
    path.write_text("\n".join(body) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    label = ""
    if argv[:1] == ["--label"] and len(argv) > 1:
        label, argv = f"{argv[1]} ", argv[2:]
    if not argv:
        print("usage: scripts/elapsed.py [--label NAME] COMMAND [ARG...]", file=sys.stderr)
        return 2
    start = time.monotonic()
    recent: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
    with subprocess.Popen(argv, **output) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            recent.append(line)
            sys.stdout.write(f"[{label}{time.monotonic() - start:7.1f}s] {line}")
            sys.stdout.flush()
    if proc.returncode != 0:
        write_failure(label, proc.returncode, list(recent))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
