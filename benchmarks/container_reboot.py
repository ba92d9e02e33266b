"""Reboot of a converged container lab host: power cycle -> systemd up -> router serving again.

Runs tests/containers/reboot.yml (the default scenario's side effect: `docker restart` of the
lab host, nothing started by hand afterwards) several times on a converged molecule default lab
and reports, per run and as median/max:

- restart: until `docker restart` returns (the clean shutdown, supervisord stopping its programs,
  plus the container's start);
- boot (the reference, measured in the same run): until systemd says `running`;
- serving: until the router's first chat completion;
- running: until every program is RUNNING in supervisor (past its startsecs: serving_worker_startsecs,
  5 s in the scenarios' stand-in overlay since 2026-12-05; results/container_reboot.md was measured
  with the lab's 30 s);
- serving / boot: what the appliance adds to a bare boot, as a ratio.

    molecule create -s default && molecule converge -s default   # a converged lab
    python benchmarks/container_reboot.py [--runs 5] [--out benchmarks/results/container_reboot.md]

Results go to benchmarks/results/container_reboot.md with the date, machine and commit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "molecule" / "default"
RESULT = ROOT / ".rehearsal" / "containers" / "default" / "reboot.json"


def reboot_once() -> dict[str, float]:
    """One power cycle through the scenario's side effect; the timings reboot.yml recorded."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    # The scenario's overlay builds its simulated GPUs with the stand-ins' filters (not in ansible.cfg).
    env["ANSIBLE_FILTER_PLUGINS"] = f"{ROOT / 'plugins/filter'}:{ROOT / 'standins/plugins/filter'}"
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    RESULT.unlink(missing_ok=True)
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            str(SCENARIO / "reboot.yml"),
            "-i",
            str(SCENARIO / "inventory"),
            f"--extra-vars=@{SCENARIO / 'vars' / 'secrets.yml'}",
            # Measure past the scenario's bound instead of stopping at it.
            "-e",
            "pdlab_reboot_bound_s=600",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"reboot.yml failed (is the default lab converged?):\n{proc.stdout[-3000:]}")
    data = json.loads(RESULT.read_text())
    return {key: float(data[key]) for key in ("restart_s", "boot_s", "serving_s", "running_s")}


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    docker = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return f"{cpu}, {os.cpu_count()} cores, Docker {docker}, {platform.machine()}"


def report(runs: list[dict[str, float]]) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    lines = [
        "# Container lab host reboot",
        "",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine()}",
        f"- commit: {commit}",
        f"- load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "- lab: molecule default (one Debian 12 container, systemd as PID 1; prefill, decode and router",
        "  with the rehearsal engine), converged; each run is `docker restart` (tests/containers/reboot.yml)",
        f"- command: `python benchmarks/container_reboot.py --runs {len(runs)}`",
        "",
        "| run | restart s | boot s (reference) | serving s | all RUNNING s | serving / boot |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for number, run in enumerate(runs, 1):
        lines.append(
            f"| {number} | {run['restart_s']:.1f} | {run['boot_s']:.1f} | {run['serving_s']:.1f} | "
            f"{run['running_s']:.1f} | "
            f"{run['serving_s'] / run['boot_s']:.2f}x |"
        )
    for name, pick in (("median", statistics.median), ("max", max)):
        restart, boot = pick(r["restart_s"] for r in runs), pick(r["boot_s"] for r in runs)
        serving, running = pick(r["serving_s"] for r in runs), pick(r["running_s"] for r in runs)
        ratio = pick(r["serving_s"] / r["boot_s"] for r in runs)
        lines.append(
            f"| {name} | {restart:.1f} | {boot:.1f} | {serving:.1f} | {running:.1f} | {ratio:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "container_reboot.md")
    args = parser.parse_args()
    runs = [reboot_once() for _ in range(args.runs)]
    text = report(runs)
    notes = (
        args.out.read_text().split("\n## ", 1)[1]
        if args.out.is_file() and "\n## " in args.out.read_text()
        else ""
    )
    args.out.write_text(text + (f"\n## {notes}" if notes else ""))
    print(text)


if __name__ == "__main__":
    main()
