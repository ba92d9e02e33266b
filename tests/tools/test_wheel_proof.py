"""The pd_appliance wheel build is a proof record's case (pd_appliance.proofs): a second run with
unchanged sources reuses the wheel and says so, appliance_force_checks builds it again, and an edited
source is built. Only the wheel tasks run (roles/appliance_tools/tasks/wheel.yml), on localhost, with
the build dir and the host's wheel dir under tmp_path: no converge."""

from __future__ import annotations

import getpass
import shutil
from pathlib import Path

from pd_testlib import ROOT, run_playbook

PLAYBOOK = """---
- name: The pd_appliance wheel alone (test)
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Build or reuse the wheel
      ansible.builtin.include_role:
        name: appliance_tools
        tasks_from: wheel
"""

SKIPPED = "PROOF SKIPPED: pd_appliance wheel build: inputs unchanged since"


def run(tmp_path: Path, source: Path, force: bool = False):
    playbook = tmp_path / "wheel.yml"
    playbook.write_text(PLAYBOOK)
    extra = [
        "-e", f"appliance_tools_source_dir={source}",
        "-e", f"appliance_tools_build_dir={tmp_path / 'build'}",
        "-e", f"appliance_tools_wheel_dir={tmp_path / 'host'}",
        "-e", "appliance_tools_build_isolation=false",
        "-e", f"appliance_config_owner={getpass.getuser()}",
        "-e", "appliance_manage_user=false",
        "-e", f"appliance_force_checks={'true' if force else 'false'}",
        "-e", f"ansible_python_interpreter={shutil.which('python3')}",
    ]  # fmt: skip
    (tmp_path / "host").mkdir(exist_ok=True)
    result = run_playbook(playbook, "localhost,", *extra, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result.stdout


def built(stdout: str) -> bool:
    """Whether the build task ran (it prints 'ok' for the host) or was skipped."""
    section = stdout.split("Build the pd_appliance wheel on the controller", 1)[1].split("TASK [", 1)[0]
    return "ok: [localhost]" in section


def test_second_build_is_skipped_forced_and_edited_ones_run(tmp_path: Path):
    source = tmp_path / "src-tree"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)

    first = run(tmp_path, source)
    assert built(first) and SKIPPED not in first
    wheel = next((tmp_path / "build").glob("pd_appliance-*.whl"))
    record = (tmp_path / "build" / "proof.json").read_text()

    second = run(tmp_path, source)
    assert not built(second) and SKIPPED in second
    assert (tmp_path / "build" / "proof.json").read_text() == record  # a skip writes no record
    assert wheel.exists()

    forced = run(tmp_path, source, force=True)
    assert built(forced) and SKIPPED not in forced

    (source / "src" / "pd_appliance" / "proofs.py").write_text(
        (source / "src" / "pd_appliance" / "proofs.py").read_text() + "\n# edited\n"
    )
    edited = run(tmp_path, source)
    assert built(edited) and SKIPPED not in edited
