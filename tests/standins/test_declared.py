"""The rehearsal and every molecule scenario are the lab layout plus declared stand-ins, nothing else.

standins/declared.yml lists every variable a stand-in inventory may set beyond inventory/lab, each with
the real part it replaces and why. Every inventory a rehearsal or a scenario converges must:
- take the lab's settings from inventory/lab/group_vars (each file a link to the lab's own),
- set anything else only in its stand-in overlay (group_vars/all/zz-standins.yml) or its hosts' vars,
- and set there only declared stand-ins, the lab's vault inputs (vault_*), or the stand-in machinery's
  own variables (standin_*, which no product role reads).
Every failure names the variable and the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_testlib import ROOT

LAB = ROOT / "inventory" / "lab"
DECLARED: dict[str, str] = yaml.safe_load((ROOT / "standins" / "declared.yml").read_text())
PARTS = (
    "GPU",
    "NVIDIA's apt repository",
    "the Hugging Face Hub",
    "the SGLang engine",
    "the host's address",
    "the install prefix",
)
OVERLAY = "zz-standins.yml"
PD_GROUPS = {"pd_appliance", "prefill", "decode", "router"}


def standin_inventories() -> list[Path]:
    """inventory/rehearsal and every inventory directory a molecule scenario ships."""
    found = [ROOT / "inventory" / "rehearsal"]
    found += sorted(p.parent for p in (ROOT / "molecule").glob("*/inventory/hosts.yml"))
    return found


def allowed(name: str) -> bool:
    return name in DECLARED or name.startswith(("vault_", "standin_"))


def _undeclared(values: dict[str, Any] | None) -> list[str]:
    return sorted(name for name in (values or {}) if not allowed(name))


def _host_vars(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """host -> vars from an inventory YAML tree (hosts and children, any depth)."""
    out: dict[str, dict[str, Any]] = {}
    for host, host_vars in (node.get("hosts") or {}).items():
        out.setdefault(host, {}).update(host_vars or {})
    for child in (node.get("children") or {}).values():
        for host, host_vars in _host_vars(child or {}).items():
            out.setdefault(host, {}).update(host_vars)
    return out


def _groups(node: dict[str, Any], name: str = "") -> dict[str, Any]:
    out = {name: node} if name else {}
    for child_name, child in (node.get("children") or {}).items():
        out.update(_groups(child or {}, child_name))
    return out


def test_every_declaration_names_the_part_it_replaces() -> None:
    for name, reason in DECLARED.items():
        assert isinstance(reason, str) and reason.startswith(PARTS), (
            f"standins/declared.yml: {name}: {reason!r} must start with one of {PARTS}"
        )
        assert ": " in reason and len(reason.split(": ", 1)[1]) > 20, (
            f"standins/declared.yml: {name} must say why the part cannot exist here"
        )


def test_no_product_role_reads_the_standin_machinery() -> None:
    used = [
        f"{path.relative_to(ROOT)}: {match}"
        for path in (ROOT / "roles").rglob("*")
        if path.is_file()
        for match in re.findall(r"\bstandin_\w+", path.read_text(errors="replace"))
    ]
    assert used == [], f"product roles must not read stand-in variables: {used}"


@pytest.mark.parametrize("inventory", standin_inventories(), ids=lambda p: str(p.relative_to(ROOT)))
def test_group_vars_are_the_labs_plus_one_overlay(inventory: Path) -> None:
    group_vars = inventory / "group_vars"
    lab_files = {p.relative_to(LAB / "group_vars") for p in (LAB / "group_vars").rglob("*.yml")}
    seen = set()
    for path in sorted(group_vars.rglob("*.yml")):
        relative = path.relative_to(group_vars)
        if relative.name == OVERLAY:
            continue
        assert path.is_symlink(), (
            f"{path.relative_to(ROOT)} is a file of its own: a stand-in inventory takes the lab's settings "
            f"by linking inventory/lab/group_vars/{relative}, and its stand-ins from {OVERLAY}"
        )
        assert path.resolve() == (LAB / "group_vars" / relative).resolve(), (
            f"{path.relative_to(ROOT)} links to {path.resolve()}, not to inventory/lab/group_vars/{relative}"
        )
        seen.add(relative)
    missing = sorted(str(p) for p in lab_files - seen)
    assert not missing, f"{inventory.relative_to(ROOT)}/group_vars lacks the lab's {missing}: link them"


def _links_to_the_labs(path: Path, host_vars: Path) -> bool:
    """A host_vars file that is a link to the lab's file of the same name: the lab's settings."""
    return path.is_symlink() and path.resolve() == (LAB / "host_vars" / path.relative_to(host_vars)).resolve()


@pytest.mark.parametrize("inventory", standin_inventories(), ids=lambda p: str(p.relative_to(ROOT)))
def test_overlay_and_host_vars_set_only_declared_standins(inventory: Path) -> None:
    problems = []
    for overlay in sorted((inventory / "group_vars").rglob(OVERLAY)):
        values = yaml.safe_load(overlay.read_text()) or {}
        problems += [f"{name} in {overlay.relative_to(ROOT)}" for name in _undeclared(values)]
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text()) or {}
    for top in hosts.values():
        for host, host_vars in _host_vars(top or {}).items():
            problems += [
                f"{name} (host {host}) in {inventory.relative_to(ROOT)}/hosts.yml"
                for name in _undeclared(host_vars)
            ]
        for group, node in _groups(top or {}).items():
            problems += [
                f"{name} (group {group} vars) in {inventory.relative_to(ROOT)}/hosts.yml"
                for name in _undeclared(node.get("vars"))
            ]
        problems += [
            f"{name} (group vars) in {inventory.relative_to(ROOT)}/hosts.yml"
            for name in _undeclared(top.get("vars"))
        ]
    for path in (
        sorted((inventory / "host_vars").rglob("*.yml")) if (inventory / "host_vars").exists() else []
    ):
        if _links_to_the_labs(path, inventory / "host_vars"):
            continue  # the lab's own host_vars (e.g. the two-host variant's serving_instances)
        values = yaml.safe_load(path.read_text()) or {}
        problems += [f"{name} in {path.relative_to(ROOT)}" for name in _undeclared(values)]
    assert not problems, (
        "variables set beyond the lab layout that are not declared stand-ins (declare them in "
        f"standins/declared.yml with the part they replace, or fix the product): {problems}"
    )


@pytest.mark.parametrize("inventory", standin_inventories(), ids=lambda p: str(p.relative_to(ROOT)))
def test_groups_are_the_labs(inventory: Path) -> None:
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text()) or {}
    groups = set()
    for name, top in hosts.items():
        groups |= {name} | set(_groups(top or {}))
    assert groups >= PD_GROUPS, (
        f"{inventory.relative_to(ROOT)}/hosts.yml lacks the lab's groups {PD_GROUPS - groups}"
    )


def _scenario_extra_vars() -> list[tuple[str, Path]]:
    """Every vars file a molecule scenario passes with --extra-vars=@FILE."""
    out = []
    for molecule_yml in sorted((ROOT / "molecule").glob("*/molecule.yml")):
        text = molecule_yml.read_text()
        for ref in re.findall(r"--extra-vars=@(\S+)", text) + re.findall(r"\s-e\s+@(\S+)", text):
            path = Path(ref.replace("${MOLECULE_SCENARIO_DIRECTORY}", str(molecule_yml.parent)).replace(
                "${MOLECULE_PROJECT_DIRECTORY}", str(ROOT)))  # fmt: skip
            out.append((molecule_yml.parent.name, path))
    return out


@pytest.mark.parametrize("scenario,vars_file", _scenario_extra_vars(), ids=lambda v: str(v))
def test_scenario_extra_vars_set_only_declared_standins(scenario: str, vars_file: Path) -> None:
    values = yaml.safe_load(vars_file.read_text()) or {}
    undeclared = _undeclared(values)
    assert not undeclared, (
        f"molecule/{scenario} passes {vars_file.relative_to(ROOT)} which sets {undeclared}: not declared "
        f"stand-ins (standins/declared.yml) nor the lab's vault inputs"
    )


def test_host_vars_may_only_link_the_labs_own(tmp_path: Path) -> None:
    """A scenario takes a lab host's layout (host_vars/gpu-decode-01.yml) by linking it, never by copying."""
    host_vars = tmp_path / "host_vars"
    host_vars.mkdir()
    (host_vars / "gpu-decode-01.yml").symlink_to(LAB / "host_vars" / "gpu-decode-01.yml")
    (host_vars / "gpu-prefill-01.yml").write_text((LAB / "host_vars" / "gpu-prefill-01.yml").read_text())
    assert _links_to_the_labs(host_vars / "gpu-decode-01.yml", host_vars)
    assert not _links_to_the_labs(host_vars / "gpu-prefill-01.yml", host_vars)
    copied = yaml.safe_load((host_vars / "gpu-prefill-01.yml").read_text())
    assert _undeclared(copied) == ["serving_instances"]


def test_the_check_catches_an_undeclared_override(tmp_path: Path) -> None:
    """The rule is not vacuous: an overlay that tunes a lab knob is reported with its name and file."""
    values = {"serving_health_interval_s": 1, "preflight_sysfs_root": "/tmp/sys"}
    assert _undeclared(values) == ["serving_health_interval_s"]
