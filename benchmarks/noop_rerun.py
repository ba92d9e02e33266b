"""The no-op re-run of a converged rehearsal: its wall time, where it goes, and against what.

A re-run of site.yml that has nothing to change should do little (issue "Every claim has a test that
can fail", target: at most 60 s with validation on the rehearsal). This measures, in one run:

- reference: what one module run costs on this machine (a playbook of --reference-tasks
  `ansible.builtin.command: true` tasks on the host's /usr/bin/python3, as the rehearsal host runs
  modules) and one control task (set_fact): the machine's speed, which varies by 10 % between
  otherwise equal runs on a shared machine;
- the no-op re-run as the README runs it (`pd-appliance deploy -i inventory/rehearsal`), --runs times;
- one more re-run through ansible-playbook with the task timing callback
  (benchmarks/callbacks/pd_task_times.py, profile_tasks' figures as data): per stage, per kind of
  task (module runs, control tasks, skipped) and the longest tasks.

Each wall is also given in module-run equivalents (wall / the reference's seconds per module run),
which compares across machines and loads. Needs a converged rehearsal (`make rehearse` first: the
first run after a source change rebuilds the wheel and is not a no-op). Results go to
benchmarks/results/noop_rerun.md with the date, machine and commit.

    python benchmarks/noop_rerun.py [--runs 3] [--reference-tasks 20]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TARGET_S = 60.0
# Tasks that run no module on the host (the controller evaluates them).
CONTROL_ACTIONS = {
    f"ansible.builtin.{name}"
    for name in ("set_fact", "assert", "include_tasks", "import_tasks", "include_role", "import_role",
                 "debug", "fail", "meta", "include_vars", "validate_argument_spec", "add_host", "group_by",
                 "set_stats")
}  # fmt: skip


# The rehearsal's filters: the product's and the stand-ins' (ansible.cfg names only the product's).
REHEARSAL_FILTER_PLUGINS = f"{ROOT / 'plugins/filter'}:{ROOT / 'standins/plugins/filter'}"


def _run(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one command run from the checkout; fails loudly with its tail."""
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        tail = done.stdout[-3000:] + done.stderr[-2000:]
        raise SystemExit(f"{' '.join(argv)} failed (rc {done.returncode}):\n{tail}")
    return wall


def reference(tasks: int) -> dict[str, float]:
    """Seconds per module run and per control task on this machine, now."""
    lines = ["---", "- hosts: all", "  gather_facts: false", "  tasks:"]
    for i in range(tasks):
        lines += [f"    - name: m{i}", "      ansible.builtin.command: 'true'", "      changed_when: false"]
    for i in range(tasks):
        lines += [f"    - name: s{i}", "      ansible.builtin.set_fact:", f"        x{i}: {i}"]
    with tempfile.TemporaryDirectory() as tmp:
        book = Path(tmp) / "reference.yml"
        book.write_text("\n".join(lines) + "\n")
        out = Path(tmp) / "times.json"
        env = _timed_env(out)
        _run([str(BIN / "ansible-playbook"), str(book), "-i", "localhost,", "-c", "local",
              "-e", "ansible_python_interpreter=/usr/bin/python3"], env)  # fmt: skip
        rows = json.loads(out.read_text())
    module = [r["seconds"] for r in rows if r["name"].startswith("m")]
    control = [r["seconds"] for r in rows if r["name"].startswith("s")]
    return {"module_s": statistics.median(module), "control_s": statistics.median(control)}


def _timed_env(out: Path) -> dict[str, str]:
    """The repository's ansible.cfg with the timing callback beside the appliance's own."""
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FILTER_PLUGINS=REHEARSAL_FILTER_PLUGINS,
        ANSIBLE_CALLBACK_PLUGINS=f"{ROOT / 'plugins/callback'}:{ROOT / 'benchmarks/callbacks'}",
        ANSIBLE_CALLBACKS_ENABLED="pd_plugin_preload,pd_task_times",
        PD_TASK_TIMES_OUT=str(out),
    )


def stage_of(path: str) -> str:
    """The role (or playbook) a task comes from."""
    relative = path.split(str(ROOT) + "/", 1)[-1]
    if relative.startswith("roles/"):
        return relative.split("/")[1]
    return relative.rsplit(":", 1)[0]


def breakdown(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals per stage and per kind of task, and the longest tasks."""
    kinds: dict[str, list[float]] = collections.defaultdict(list)
    stages: dict[str, float] = collections.Counter()
    for row in rows:
        kind = "skipped" if not row["ran"] else ("control" if row["action"] in CONTROL_ACTIONS else "module")
        kinds[kind].append(row["seconds"])
        stages[stage_of(row["path"])] += row["seconds"]
    longest = sorted(rows, key=lambda r: -r["seconds"])[:15]
    return {
        "tasks": len(rows),
        "task_seconds": sum(r["seconds"] for r in rows),
        "kinds": {kind: {"count": len(times), "seconds": sum(times)} for kind, times in kinds.items()},
        "stages": dict(sorted(stages.items(), key=lambda kv: -kv[1])),
        "longest": [{"seconds": r["seconds"], "action": r["action"], "name": r["name"]} for r in longest],
    }


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def commit() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT,
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout.strip() or "unknown"


def render(ref: dict[str, float], walls: list[float], detail: dict[str, Any]) -> str:
    module_s = ref["module_s"]
    median = statistics.median(walls)
    lines = [
        "# No-op re-run of the converged rehearsal",
        "",
        f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {machine()}, commit {commit()}, "
        f"load {os.getloadavg()[0]:.2f} at the end, by `python benchmarks/noop_rerun.py`.",
        "",
        "| what | seconds | module-run equivalents |",
        "| --- | --- | --- |",
        f"| reference: one module run (`command: true`, /usr/bin/python3) | {module_s:.3f} | 1 |",
        f"| reference: one control task (`set_fact`) | {ref['control_s']:.3f} "
        f"| {ref['control_s'] / module_s:.2f} |",
        f"| `pd-appliance deploy -i inventory/rehearsal`, no-op, median of {len(walls)} "
        f"({', '.join(f'{w:.1f}' for w in walls)}) | {median:.1f} | {median / module_s:.0f} |",
        f"| target | {TARGET_S:.0f} | {TARGET_S / module_s:.0f} |",
        "",
        f"One more no-op through ansible-playbook with the task timing callback: {detail['tasks']} tasks, "
        f"{detail['task_seconds']:.1f} s of task time.",
        "",
        "| kind | tasks | seconds |",
        "| --- | --- | --- |",
    ]
    for kind, figures in sorted(detail["kinds"].items()):
        lines.append(f"| {kind} | {figures['count']} | {figures['seconds']:.1f} |")
    lines += ["", "| stage (role or playbook) | seconds |", "| --- | --- |"]
    lines += [f"| {stage} | {seconds:.1f} |" for stage, seconds in detail["stages"].items() if seconds >= 0.5]
    lines += ["", "| longest tasks | action | seconds |", "| --- | --- | --- |"]
    lines += [f"| {row['name']} | {row['action']} | {row['seconds']:.2f} |" for row in detail["longest"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reference-tasks", type=int, default=20)
    parser.add_argument("--inventory", default="inventory/rehearsal")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/noop_rerun.md")
    args = parser.parse_args()
    ref = reference(args.reference_tasks)
    # As `make deploy` runs it on the rehearsal: with the stand-ins' filters on the path.
    rehearsal = dict(os.environ, ANSIBLE_FILTER_PLUGINS=REHEARSAL_FILTER_PLUGINS)
    deploy = [str(BIN / "pd-appliance"), "deploy", "-i", args.inventory]
    walls = [_run(deploy, rehearsal) for _ in range(args.runs)]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        _run([str(BIN / "ansible-playbook"), "site.yml", "-i", args.inventory], _timed_env(out))
        detail = breakdown(json.loads(out.read_text()))
    text = render(ref, walls, detail)
    args.out.write_text(text)
    print(text)
    return 0 if statistics.median(walls) <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
