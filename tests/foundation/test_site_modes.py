"""The conventions a lab user relies on, on the rehearsal: `--check --diff` runs to the end on a fresh
host and on a converged one, and every stage tag the README names runs alone.

One private copy of inventory/rehearsal (its own root and free ports), the Hub stand-in started the way
`make rehearse` starts it (standins/prepare.yml, at a free port), then:
fresh --check -> converge -> converged --check (changes nothing it would not report) -> each stage tag
alone. Everything it started is stopped at the end, also on failure.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pd_testlib import private_artifacts, rehearsal_ports, reserve_ports, run_playbook

pytestmark = pytest.mark.slow

# The stages README.md names as tags (`ansible-playbook site.yml -i inventory/lab --tags checkpoint`).
STAGE_TAGS = ("preflight", "provision", "checkpoint", "serve", "validate")


def _recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    match = re.search(
        r"localhost\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", result.stdout
    )
    assert match, result.stdout[-3000:] + result.stderr[-2000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups()), strict=True))


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    return output


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("modes")
    from shutil import copytree

    from pd_testlib import ROOT

    target = base / "inventory" / "rehearsal"
    copytree(ROOT / "inventory" / "rehearsal", target)
    # Reserved ports for every program, the monitor stage's included; artifacts under base.
    overrides: dict[str, object] = {**rehearsal_ports(), **private_artifacts(base)}
    overrides["checkpoint_hf_endpoint"] = f"http://127.0.0.1:{reserve_ports(1)[0]}"
    (target / "group_vars" / "all" / "zz-test-ports.yml").write_text(yaml.safe_dump(overrides))
    _ok(run_playbook("standins/prepare.yml", target))
    try:
        yield target
    finally:
        run_playbook("playbooks/day2/stop.yml", target, timeout=300)
        run_playbook("standins/cleanup.yml", target, timeout=120)


@pytest.mark.timeout(2400)
def test_check_diff_fresh_converge_check_and_each_tag_alone(inventory: Path) -> None:
    root = inventory.parent.parent / ".rehearsal" / "root"

    fresh = _ok(run_playbook("site.yml", inventory, "--check", "--diff", timeout=1200))
    assert "PLAY [Validate" in fresh, "check mode must run to the last stage"
    assert not (root / "opt" / "pd-appliance" / "tools").exists(), "check mode created the tools venv"

    converge = run_playbook("site.yml", inventory, timeout=1800)
    _ok(converge)

    converged = run_playbook("site.yml", inventory, "--check", "--diff", timeout=1200)
    _ok(converged)
    assert _recap(converged)["changed"] == 0, converged.stdout[-5000:]

    for tag in STAGE_TAGS:
        alone = run_playbook("site.yml", inventory, "--tags", tag, timeout=1200)
        output = _ok(alone)
        assert re.search(rf"PLAY \[{tag.capitalize()}", output, re.IGNORECASE), (
            f"--tags {tag} ran no {tag} play"
        )
