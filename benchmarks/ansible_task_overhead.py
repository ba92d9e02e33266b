"""What the appliance's filter plugins cost each task, with and without pd_plugin_preload.

ansible-playbook forks a worker per task; a filter plugin the main process never imported is
imported again in every worker (plugins/callback/pd_plugin_preload.py says why). This runs one
playbook of N trivial tasks (set_fact with a builtin filter, the commonest task kind in the roles)
on localhost, with the repository's ansible.cfg, three ways in the same run:

- reference: no appliance filter plugins on the path at all (ANSIBLE_FILTER_PLUGINS=/nonexistent);
- without the preload: the appliance's filters on the path, the callback not on its path;
- with the preload: ansible.cfg as shipped.

and reports each as CPU seconds per task (the process tree's user+sys) and as a ratio to the
reference, median of --runs. Results go to benchmarks/results/ansible_task_overhead.md with the
date, machine and commit.

    python benchmarks/ansible_task_overhead.py [--tasks 40] [--runs 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "reference (no appliance filters)": {"ANSIBLE_FILTER_PLUGINS": "/nonexistent"},
    "appliance filters, no preload": {"ANSIBLE_CALLBACK_PLUGINS": "/nonexistent"},
    "appliance filters, preloaded (as shipped)": {},
}


def playbook(tasks: int, directory: Path) -> Path:
    lines = ["---", "- hosts: all", "  gather_facts: false", "  tasks:"]
    for i in range(tasks):
        value = "{{ " + str(i) + " | string }}"
        lines += [f"    - name: t{i}", "      ansible.builtin.set_fact:", f'        x{i}: "{value}"']
    path = directory / "tasks.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cpu_seconds(book: Path, extra_env: dict[str, str]) -> float:
    """CPU time of one ansible-playbook run and its children (workers), in seconds."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), **extra_env)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(book), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(
            f"ansible-playbook failed ({extra_env}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/ansible_task_overhead.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        book = playbook(args.tasks, Path(tmp))
        samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.runs):  # interleaved, so a load change hits every variant alike
            for name, env in VARIANTS.items():
                samples[name].append(cpu_seconds(book, env))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    reference = medians["reference (no appliance filters)"]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    rows = [
        f"| {name} | {cpu:.2f} | {cpu / args.tasks:.3f} | {cpu / reference:.2f} |"
        for name, cpu in medians.items()
    ]
    report = "\n".join(
        [
            "# ansible task overhead: the appliance's filter plugins, with and without pd_plugin_preload",
            "",
            f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()} "
            f"({os.cpu_count()} cores), commit {commit}; {args.tasks} set_fact tasks on localhost, "
            f"median of {args.runs} interleaved runs (CPU of ansible-playbook and its workers).",
            "",
            "| variant | CPU s per run | CPU s per task | ratio to the reference |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
        ]
    )
    args.out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
