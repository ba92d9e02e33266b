#!/usr/bin/env python3
"""Run a command and prefix each line it prints with the seconds since it started (and a label).

    scripts/elapsed.py [--label NAME] COMMAND [ARG...]

make's molecule targets run through it, so a CI log shows what each molecule step (create,
converge, idempotence, check, verify, side_effect, ...) took, the table in docs/molecule.md, and
the lines of scenarios that run at once can be told apart. Exits with the command's status.
"""

from __future__ import annotations

import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    label = ""
    if argv[:1] == ["--label"] and len(argv) > 1:
        label, argv = f"{argv[1]} ", argv[2:]
    if not argv:
        print("usage: scripts/elapsed.py [--label NAME] COMMAND [ARG...]", file=sys.stderr)
        return 2
    start = time.monotonic()
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
    with subprocess.Popen(argv, **output) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(f"[{label}{time.monotonic() - start:7.1f}s] {line}")
            sys.stdout.flush()
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
