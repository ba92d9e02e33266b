"""files/locks/tools and files/locks/router: the tools and router venvs install from hashed locks.

CI's check of the supply chain of the two small venvs, like tests/sglang/test_lock.py for the SGLang
venv: every entry pinned and hashed, the roots pinned as requirements.in asks, a lock for every
Python the supported operating systems run (Ubuntu 22.04: 3.10, Debian 12: 3.11, Ubuntu 24.04: 3.12),
the tools lock honouring every dependency of the pd_appliance wheel (pyproject.toml) on each of them,
and no pip install in the role that could resolve outside a lock or skip the hashes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomllib
import yaml

from lock_requirements import marker_environment, unmet_requirements
from pd_appliance.supply import lock

ROOT = Path(__file__).resolve().parents[2]
LOCK_DIRS = {"tools": ROOT / "files/locks/tools", "router": ROOT / "files/locks/router"}
ROLE = ROOT / "roles/appliance_tools"
PYTHONS = {"3.10", "3.11", "3.12"}


def _manifest(kind: str) -> dict:
    return json.loads((LOCK_DIRS[kind] / "manifest.json").read_text())


def _roots(kind: str) -> list[str]:
    text = (LOCK_DIRS[kind] / "requirements.in").read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


LOCKS = [(kind, py, name) for kind in LOCK_DIRS for py, name in sorted(_manifest(kind)["locks"].items())]


@pytest.mark.parametrize("kind", sorted(LOCK_DIRS))
def test_manifest_has_a_lock_for_every_supported_python(kind: str) -> None:
    manifest = _manifest(kind)
    assert set(manifest["locks"]) == PYTHONS and manifest["unsupported"] == {}
    assert manifest["requirements"] == _roots(kind)
    assert f"pd_appliance.supply.generate files/locks/{kind} " in manifest["command"]
    for python in PYTHONS:
        assert f"--python {python}" in manifest["command"]


@pytest.mark.parametrize(("kind", "python", "name"), LOCKS)
def test_every_entry_is_pinned_hashed_and_the_roots_as_asked(kind: str, python: str, name: str) -> None:
    text = (LOCK_DIRS[kind] / name).read_text()
    entries = lock.parse_lock(text, name)
    assert len(entries) == len(re.findall(r"(?m)^[A-Za-z0-9]", text))
    assert all(e.hashes and all(len(h) == 64 for h in e.hashes) for e in entries.values())
    for root in _roots(kind):
        if "==" in root:
            pkg, version = root.split("==")
            assert entries[pkg].version == version, f"{name}: {root} not pinned as asked"
    assert name == f"py{python}-x86_64.txt"


@pytest.mark.parametrize("python", sorted(PYTHONS))
def test_tools_lock_honours_the_pd_appliance_wheels_dependencies(python: str) -> None:
    """The wheel goes in with --no-deps: each of its Requires-Dist must already be in the lock."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    entries = lock.read_lock(LOCK_DIRS["tools"] / _manifest("tools")["locks"][python])
    problems = unmet_requirements(entries, project["dependencies"], marker_environment(python, "x86_64"))
    assert [str(p) for p in problems] == []
    # and what the role's import check and the serving role's supervisord need
    needed = {"supervisor", "nvidia-ml-py", "huggingface-hub", "tokenizers", "prometheus-client"}
    assert needed <= set(entries)


def test_the_check_catches_a_lock_that_misses_a_wheel_dependency() -> None:
    entries = lock.read_lock(LOCK_DIRS["tools"] / _manifest("tools")["locks"]["3.12"])
    del entries["prometheus-client"]
    entries["tokenizers"].version = "0.22.0"
    problems = unmet_requirements(
        entries, ["prometheus-client==0.26.0", "tokenizers==0.23.3"], marker_environment("3.12")
    )
    assert [str(p) for p in problems] == [
        "prometheus-client==0.26.0: absent from the lock",
        "tokenizers==0.23.3: locked at 0.22.0",
    ]


def test_router_lock_holds_smg_and_what_it_pulls_in() -> None:
    for python in PYTHONS:
        entries = lock.read_lock(LOCK_DIRS["router"] / _manifest("router")["locks"][python])
        assert entries["smg"].version == "1.13.0"
        assert lock.closure(entries, ["smg"]) == sorted(entries)


def _tasks(path: Path) -> list[dict]:
    out: list[dict] = []
    for task in yaml.safe_load(path.read_text()) or []:
        out.append(task)
        out.extend(task.get("block", []))
    return out


def test_every_pip_install_of_the_role_is_locked_and_hashed() -> None:
    installs = []
    for path in sorted((ROLE / "tasks").glob("*.yml")):
        for task in _tasks(path):
            argv = task.get("ansible.builtin.command", {}).get("argv", "")
            if isinstance(argv, str) and "'pip', 'install'" in argv:
                installs.append((path.name, task["name"], argv))
    assert len(installs) == 3, installs  # tools lock, pd_appliance wheel, router lock
    for file, name, argv in installs:
        assert "'--require-hashes'" in argv and "'--no-deps'" in argv, f"{file}: {name}"
        assert "'-r'" in argv, f"{file}: {name} installs something that is not a lock file"


def test_the_role_points_at_the_locks() -> None:
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    assert defaults["appliance_tools_lock_dir"].endswith("/files/locks/tools")
    assert defaults["appliance_tools_router_lock_dir"].endswith("/files/locks/router")
    assert not {"appliance_tools_packages", "appliance_tools_router_packages"} & set(defaults)
