"""pd_plugin_preload loads wherever the appliance runs ansible-playbook (plugins/callback/).

Its effect (CPU per task) is a benchmark, benchmarks/ansible_task_overhead.py; here: the callback is
found and enabled by ansible.cfg for a plain ansible-playbook, and through pd-appliance's
ansible-runner environment, which would otherwise replace the callback path and drop it with only a
warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ansible_runner

from pd_appliance.cli import runner_env
from pd_testlib import ROOT

SKIPPED = "Skipping callback plugin 'pd_plugin_preload'"
PLAYBOOK = """---
- name: One task that templates
  hosts: all
  gather_facts: false
  tasks:
    - name: A filter
      ansible.builtin.set_fact:
        answer: "{{ [1, 2] | max }}"
"""


def _playbook(tmp_path: Path) -> Path:
    path = tmp_path / "play.yml"
    path.write_text(PLAYBOOK)
    return path


def test_ansible_cfg_enables_the_preload(tmp_path: Path) -> None:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    env.pop("ANSIBLE_CALLBACK_PLUGINS", None)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(_playbook(tmp_path)), "-i", "localhost,",
         "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert SKIPPED not in result.stdout + result.stderr
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-config"), "dump", "--only-changed"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "pd_plugin_preload" in listed, listed


def test_the_cli_runner_environment_keeps_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = ansible_runner.run(
        private_data_dir=str(run_dir), project_dir=str(ROOT), playbook=str(_playbook(tmp_path)),
        inventory="localhost,", cmdline=f"-c local -e ansible_python_interpreter={sys.executable}",
        envvars=runner_env(ROOT), quiet=True, ident="run",
    )  # fmt: skip
    output = result.stdout.read()
    assert result.rc == 0, output[-3000:]
    assert SKIPPED not in output, output[-3000:]


FILTER_PLAY = """---
- name: A filter of the appliance's
  hosts: all
  gather_facts: false
  tasks:
    - name: The digest pd_appliance.proofs computes
      ansible.builtin.debug:
        msg: "digest={{ {'a': 1} | pd_proof_digest }}"
"""

# ansible-playbook from a Python whose sys.path lacks the checkout's src/ (as a distribution's
# ansible-playbook would): only the callback's bootstrap makes pd_appliance importable for the filters.
WITHOUT_SRC = """
import sys
sys.path = [p for p in sys.path if p.rstrip("/") != {src!r}]
sys.modules.pop("pd_appliance", None)
sys.argv = ["ansible-playbook", *sys.argv[1:]]
from ansible.cli.playbook import main
main()
"""


def test_the_filters_import_pd_appliance_through_the_preload_alone(tmp_path: Path) -> None:
    from pd_appliance.proofs import digest

    play = tmp_path / "filter.yml"
    play.write_text(FILTER_PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    env.pop("PYTHONPATH", None)
    command = [sys.executable, "-c", WITHOUT_SRC.format(src=str(ROOT / "src")), str(play), "-i", "localhost,",
               "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"digest={digest({'a': 1})}" in result.stdout
    # The same run without the preload: the filter is not found (so the run above proves the bootstrap).
    disabled = dict(env, ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.junit", JUNIT_OUTPUT_DIR=str(tmp_path))
    without = subprocess.run(command, cwd=ROOT, env=disabled, capture_output=True, text=True, timeout=300)
    assert without.returncode != 0, without.stdout[-2000:]
    assert "pd_proof_digest" in without.stdout + without.stderr
