"""The modules' shared bootstrap (plugins/module_utils/pd_module.py) travels in their payload.

A module run with a Python that lacks pd_appliance (the host's own, before the tools venv exists)
fails with its own message naming the fix, not a traceback: the module_utils file reaches the host
through ansible.cfg's module_utils path, and the message keeps the module's words.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from pd_testlib import ROOT, run_playbook

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


TOOLS_PLAY = """---
- name: Every module that imports pd_appliance, with the tools venv's Python
  hosts: all
  gather_facts: false
  vars:
    ansible_python_interpreter: {python}
    scratch: {scratch}
  tasks:
    - name: Each module once, past its imports
      ansible.builtin.include_tasks: {tasks}
    - name: Keep what they said
      ansible.builtin.copy:
        content: "{{{{ results | to_json }}}}"
        dest: "{{{{ scratch }}}}/results.json"
        mode: "0600"
"""

# One call a module, each with arguments its own logic answers (a result or its own refusal): past
# the `with tools_venv(...)` imports, whatever else happens.
TOOLS_TASKS = """---
- name: pd_bench, in check mode (nothing measured)
  pd_bench:
    url: http://127.0.0.1:9
  check_mode: true
  register: pd_bench
- name: pd_bench_report
  pd_bench_report:
    thresholds: {}
    history_path: "{{ scratch }}/history.jsonl"
    out_dir: "{{ scratch }}/report"
  check_mode: true
  register: pd_bench_report
  ignore_errors: true
- name: pd_bench_select
  pd_bench_select:
    measurements: []
  register: pd_bench_select
- name: pd_hf_checkpoint
  pd_hf_checkpoint:
    repo_id: org/absent
    revision: main
    dir: "{{ scratch }}/model"
    offline: true
  check_mode: true
  register: pd_hf_checkpoint
  ignore_errors: true
- name: pd_host_state
  pd_host_state:
    facts_dir: "{{ scratch }}/facts.d"
  register: pd_host_state
- name: pd_nvml_facts
  pd_nvml_facts:
    nvml_module: pd_absent_nvml
  register: pd_nvml_facts
  ignore_errors: true
- name: pd_release
  pd_release:
    action: status
    state_dir: "{{ scratch }}/releases"
  check_mode: true
  register: pd_release
- name: pd_sglang_lock_check
  pd_sglang_lock_check:
    lock: "{{ scratch }}/absent.lock"
    python_version: "3.11"
  register: pd_sglang_lock_check
  ignore_errors: true
- name: pd_sglang_patch_series
  pd_sglang_patch_series:
    site_packages: "{{ scratch }}/site-packages"
    series_dir: "{{ scratch }}/series"
    marker: "{{ scratch }}/marker"
    pristine_dir: "{{ scratch }}/pristine"
    version: 0.0.0
  check_mode: true
  register: pd_sglang_patch_series
  ignore_errors: true
- name: pd_sglang_versions
  pd_sglang_versions:
    venv: "{{ scratch }}/absent-venv"
  register: pd_sglang_versions
  ignore_errors: true
- name: pd_venv_state
  pd_venv_state:
    venvs: []
    proof_record: "{{ scratch }}/absent.proof"
  register: pd_venv_state
- name: Gather them
  ansible.builtin.set_fact:
    results: "{{ dict(names | zip(names | map('extract', vars))) }}"
  vars:
    names: [pd_bench, pd_bench_report, pd_bench_select, pd_hf_checkpoint, pd_host_state, pd_nvml_facts,
            pd_release, pd_sglang_lock_check, pd_sglang_patch_series, pd_sglang_versions, pd_venv_state]
"""

MODULES = {path.stem for path in (ROOT / "plugins/modules").glob("*.py") if "tools_venv(" in path.read_text()}


def test_with_the_tools_venv_every_module_gets_past_its_imports(tmp_path: Path) -> None:
    playbook = tmp_path / "play.yml"
    tasks = tmp_path / "tasks.yml"
    tasks.write_text(TOOLS_TASKS)
    playbook.write_text(TOOLS_PLAY.format(python=sys.executable, scratch=tmp_path, tasks=tasks))
    done = run_playbook(playbook, "localhost,", "-c", "local")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == MODULES  # every module with the bootstrap is called here
    for name, result in results.items():
        said = json.dumps(result)
        assert "not importable" not in said and "module_stderr" not in said and "Traceback" not in said, name
    assert results["pd_bench"]["msg"] == "check mode: nothing measured"
    assert results["pd_bench_select"]["fastest"] is None and not results["pd_bench_select"].get("failed")
    assert results["pd_sglang_lock_check"]["msg"].startswith("cannot read the lock")
    assert not results["pd_host_state"].get("failed") and not results["pd_release"].get("failed")
