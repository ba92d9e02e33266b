"""The day2 role: one entry point per day-2 play, its knobs documented and typed per entry point,
and the knobs' old serving_* names refused rather than ignored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "day2"
ENTRY_POINTS = ["status", "restart", "stop", "diagnostics", "profile", "drain"]


def _specs() -> dict[str, dict]:
    return yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def test_each_entry_point_is_a_task_file_a_play_calls() -> None:
    assert sorted(_specs()) == sorted(ENTRY_POINTS)
    called = set()
    for play in (ROOT / "playbooks" / "day2").glob("*.yml"):
        for doc in yaml.safe_load(play.read_text()):
            for task in doc.get("tasks", []):
                include = task.get("ansible.builtin.include_role") or {}
                if include.get("name") == "day2":
                    called.add(include["tasks_from"])
    assert called == set(ENTRY_POINTS)
    assert all((ROLE / "tasks" / f"{name}.yml").is_file() for name in ENTRY_POINTS)


def test_defaults_and_argument_specs_agree() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    options = {name: opt for spec in _specs().values() for name, opt in (spec.get("options") or {}).items()}
    assert sorted(set(defaults) ^ set(options)) == []
    assert all(name.startswith("day2_") for name in defaults)
    assert all(opt.get("description") for opt in options.values())
    lines = (ROLE / "defaults" / "main.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line and line[0].isalpha():
            j = i - 1
            while j >= 0 and lines[j].strip() and not lines[j].startswith("#"):
                j -= 1  # related knobs share the comment above them
            assert j >= 0 and lines[j].startswith("#"), f"{line.split(':')[0]} has no comment"
    # Moved, not copied: the serving role no longer has them.
    serving = yaml.safe_load((ROOT / "roles" / "serving" / "defaults" / "main.yml").read_text())
    assert not {name.replace("day2_", "serving_", 1) for name in defaults} & set(serving)


@pytest.mark.parametrize("entry_point", ["restart", "status"])
def test_an_old_serving_name_is_refused_before_anything_runs(tmp_path: Path, entry_point: str) -> None:
    play = tmp_path / "play.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [{"ansible.builtin.include_role": {"name": "day2", "tasks_from": entry_point}}],
                }
            ]
        )
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    ansible = Path(sys.executable).parent / "ansible-playbook"
    run = subprocess.run(
        [str(ansible), "-i", "localhost,", "-c", "local", str(play), "-e", "serving_restart=decode-1"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert run.returncode != 0
    assert "serving_restart: the day-2 variables are named day2_* now" in run.stdout
    assert "give day2_restart instead" in run.stdout
    # Nothing of the entry point ran: the refusal is its first task after the argument check.
    assert "Query supervisor" not in run.stdout and "Choose the programs to restart" not in run.stdout
