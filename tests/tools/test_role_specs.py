"""Every variable of the appliance_tools, nixl and sglang roles is documented and type-checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ["appliance_tools", "nixl", "sglang"]


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_argument_specs_agree(role: str) -> None:
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert sorted(set(defaults) - set(options)) == [], "defaults without an argument spec"
    assert sorted(set(options) - set(defaults)) == [], "argument specs without a default"
    assert all(name.startswith(f"{role}_") for name in defaults), "role-prefixed names"
    assert all(opt.get("description") for opt in options.values())


@pytest.mark.parametrize("role", ROLES)
def test_every_default_has_a_comment(role: str) -> None:
    lines = (ROOT / "roles" / role / "defaults" / "main.yml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        if line and line[0].isalpha() and ":" in line:
            j = i - 1
            while j >= 0 and not lines[j].startswith("#") and lines[j].strip():
                j -= 1  # related variables (and their folded values) share the comment above them
            if j < 0 or not lines[j].startswith("#"):
                undocumented.append(line.split(":", 1)[0])
    assert undocumented == []


def test_shared_variables_are_not_redefined() -> None:
    shared = set(yaml.safe_load((ROOT / "roles/appliance_defaults/defaults/main.yml").read_text()))
    for role in ROLES:
        defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
        assert not shared & set(defaults), f"{role} redefines {shared & set(defaults)}"
