"""The modules' shared bootstrap (plugins/module_utils/pd_module.py) travels in their payload.

A module run with a Python that lacks pd_appliance (the host's own, before the tools venv exists)
fails with its own message naming the fix, not a traceback: the module_utils file reaches the host
through ansible.cfg's module_utils path, and the message keeps the module's words.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pd_testlib import run_playbook

PLAY = """---
- name: Modules with a Python that lacks pd_appliance
  hosts: all
  gather_facts: false
  vars:
    ansible_python_interpreter: {python}
  tasks:
    - name: A module with the common message
      pd_venv_state:
        venvs: []
        proof_record: /nonexistent
      register: common
      ignore_errors: true
    - name: A module with its own message and a cause
      pd_nvml_facts:
      register: own
      ignore_errors: true
    - name: Keep what they said
      ansible.builtin.copy:
        content: "{{{{ {{'common': common, 'own': own}} | to_json }}}}"
        dest: {out}
        mode: "0600"
"""


def test_a_module_outside_the_tools_venv_fails_with_its_message(tmp_path: Path) -> None:
    python = shutil.which("python3", path="/usr/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3 to run the modules with")
    out = tmp_path / "results.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY.format(python=python, out=out))
    done = run_playbook(playbook, "localhost,", "-c", "local")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    results = json.loads(out.read_text())
    common, own = results["common"], results["own"]
    assert common["failed"] and own["failed"]
    assert common["msg"] == (
        "pd_appliance is not importable (No module named 'pd_appliance'): run it with the tools venv's Python"
    )
    missing = "(No module named 'pd_appliance')"
    assert own["msg"].startswith(f"pd_appliance is not importable by {python} {missing}")
    assert own["msg"].endswith("after the appliance_tools role.")
    assert own["cause"] == "tools_missing"
    assert "Traceback" not in json.dumps(results)
