"""The tuning role's one interface (roles/tuning): every option it reads is in defaults/main.yml and
its argument specs, every other tuning_* name it reads is a fact it sets itself, and
playbooks/validate.yml passes each entry point exactly its options. A variable read from nowhere
(a hidden global of the validation role) fails here before a rehearsal does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from pd_testlib import ROOT

ROLE = ROOT / "roles/tuning"
NAME = re.compile(r"\b(tuning_[a-z0-9_]+)")


def _tasks(data: Any) -> list[dict[str, Any]]:
    """Every task of a task file, blocks and their rescue/always included."""
    out: list[dict[str, Any]] = []
    for task in data or []:
        out.append(task)
        for key in ("block", "rescue", "always"):
            out.extend(_tasks(task.get(key)))
    return out


def _names(path: Path) -> set[str]:
    """The tuning_* names a YAML file uses (its comments left out)."""
    return set(NAME.findall(yaml.safe_dump(yaml.safe_load(path.read_text()))))


def _set_by_the_role() -> set[str]:
    """The facts, registers, loop variables and pd_bench results the role's task files set."""
    names: set[str] = set()
    for path in (ROLE / "tasks").glob("*.yml"):
        for task in _tasks(yaml.safe_load(path.read_text())):
            names.update(k for k in (task.get("ansible.builtin.set_fact") or {}) if k.startswith("tuning_"))
            if str(task.get("register", "")).startswith("tuning_"):
                names.add(task["register"])
            # What it measures through roles/validation's pd_bench task file, kept under the name it gives.
            names.update(v for k, v in (task.get("vars") or {}).items() if k == "__validation_bench_as")
            loop_var = (task.get("loop_control") or {}).get("loop_var", "")
            if loop_var.startswith("tuning_"):
                names.add(loop_var)
    return names


def _options() -> dict[str, set[str]]:
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]
    return {entry: set(spec.get("options") or {}) for entry, spec in specs.items()}


def _play_includes() -> dict[str, set[str]]:
    """What playbooks/validate.yml passes to each entry point of the tuning role."""
    plays = yaml.safe_load((ROOT / "playbooks/validate.yml").read_text())
    passed: dict[str, set[str]] = {}
    for play in plays:
        for task in _tasks(play.get("tasks")):
            include = task.get("ansible.builtin.include_role") or {}
            if include.get("name") == "tuning":
                passed[include.get("tasks_from", "main")] = set(task.get("vars") or {})
    return passed


def test_every_option_has_a_default_and_a_spec() -> None:
    defaults = set(yaml.safe_load((ROLE / "defaults/main.yml").read_text()))
    specified = set().union(*_options().values())
    assert defaults == specified, (defaults - specified, specified - defaults)


def test_every_tuning_name_the_role_reads_is_an_option_or_its_own_fact() -> None:
    files = [*(ROLE / "tasks").glob("*.yml"), ROLE / "vars/main.yml"]
    read = set().union(*(_names(path) for path in files))
    known = set().union(*_options().values()) | _set_by_the_role()
    assert read - known == set(), "read but neither an option nor set by the role"
    # The search's state and results, which the validation report and gate read.
    assert {
        "tuning_measurements",
        "tuning_search",
        "tuning_selection",
        "tuning_final_variant",
        "tuning_final_probe",
    } <= _set_by_the_role()


def test_the_validate_play_passes_each_entry_point_its_options() -> None:
    assert _play_includes() == _options()


def test_the_validation_role_reads_the_tuner_only_through_its_results() -> None:
    """The validation role names no option of the tuning role and sets none of its facts."""
    options = set().union(*_options().values())
    for path in (ROOT / "roles/validation").rglob("*.yml"):
        names = _names(path)
        assert names & options == set(), (path, names & options)
        assert names <= _set_by_the_role(), (path, names - _set_by_the_role())
