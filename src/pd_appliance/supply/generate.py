"""Regenerate the SGLang venv's hashed locks with uv (run on a controller that reaches the index).

    python -m pd_appliance.supply.generate files/locks/sglang-0.5.23 --python 3.10 --python 3.11 \\
        --python 3.12 --exclude-newer 2026-12-03T00:00:00Z

For each Python it resolves ``requirements.in`` (minus ``excludes.txt``) with wheels only
(``--only-binary :all:``) for CPython on manylinux ``--glibc`` ``--machine``, so a lock exists exactly
for the Python versions every package has a wheel for; uv's reason for a version it cannot serve is
kept in manifest.json (``unsupported``), which the sglang role and preflight read. ``--exclude-newer``
makes a rerun reproduce the same lock from the same index.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from pd_appliance.supply.lock import read_lock


def lock_name(python: str, machine: str) -> str:
    """File name of the lock for one Python and machine."""
    return f"py{python}-{machine}.txt"


def _reason(stderr: str) -> str:
    """uv's own explanation, without its decoration (the first 'hint:' or 'cause:' sentence)."""
    for marker in ("hint:", "cause:"):
        for line in stderr.splitlines():
            if line.strip().startswith(marker):
                return line.strip().removeprefix(marker).strip()
    return stderr.strip().splitlines()[-1] if stderr.strip() else "uv could not resolve it"


def compile_lock(
    lock_dir: Path, python: str, machine: str, glibc: str, exclude_newer: str, uv: str, command: str
) -> tuple[str | None, str | None]:
    """Run uv pip compile for one Python; (lock file name, None) or (None, reason)."""
    out = lock_dir / lock_name(python, machine)
    argv = [
        uv, "pip", "compile", "requirements.in", "--excludes", "excludes.txt", "--only-binary", ":all:",
        "--generate-hashes", "--python-version", python,
        "--python-platform", f"{machine}-manylinux_{glibc.replace('.', '_')}",
        "--exclude-newer", exclude_newer, "--custom-compile-command", command, "-o", out.name,
    ]  # fmt: skip
    run = subprocess.run(argv, cwd=lock_dir, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        out.unlink(missing_ok=True)
        return None, _reason(run.stderr)
    read_lock(out)  # every entry pinned and hashed, or this raises
    return out.name, None


def _lines(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def main(argv: list[str] | None = None) -> int:
    """CLI: write the locks and manifest.json into the lock directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock_dir", type=Path, help="directory with requirements.in and excludes.txt")
    parser.add_argument("--python", action="append", required=True, help="major.minor, repeatable")
    parser.add_argument("--machine", default="x86_64")
    parser.add_argument("--glibc", default="2.34", help="oldest glibc the hosts run (manylinux_X_Y)")
    parser.add_argument("--exclude-newer", required=True, help="RFC 3339 time: the index as it was then")
    parser.add_argument("--uv", default=shutil.which("uv") or "uv")
    args = parser.parse_args(argv)
    lock_dir = args.lock_dir.resolve()
    pythons = " ".join(f"--python {p}" for p in args.python)
    command = (
        f"python -m pd_appliance.supply.generate {args.lock_dir} {pythons} --machine {args.machine} "
        f"--glibc {args.glibc} --exclude-newer {args.exclude_newer}"
    )
    version = subprocess.run(
        [args.uv, "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    manifest: dict[str, object] = {
        "requirements": _lines(lock_dir / "requirements.in"),
        "excludes": _lines(lock_dir / "excludes.txt"),
        "machine": args.machine,
        "glibc": args.glibc,
        "exclude_newer": args.exclude_newer,
        "uv": version,
        "command": command,
        "locks": {},
        "unsupported": {},
    }
    for python in args.python:
        name, reason = compile_lock(
            lock_dir, python, args.machine, args.glibc, args.exclude_newer, args.uv, command
        )
        if name:
            manifest["locks"][python] = name  # type: ignore[index]
        else:
            manifest["unsupported"][python] = reason  # type: ignore[index]
        print(f"{python}: {name or 'no lock: ' + str(reason)}")
    (lock_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return 0 if manifest["locks"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
