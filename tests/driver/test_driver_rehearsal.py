"""nvidia_driver + cuda_toolkit in rehearsal, through ansible-playbook: simulated facts, rendered files,
the facts assertions failing with their fix, and pd_nvml_facts' no-driver path on this GPU-less machine."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pd_standins import nvml as standin_nvml
from pd_testlib import ROOT, run_playbook

pytestmark = pytest.mark.slow

PLAY = """
- name: Driver stage in rehearsal
  hosts: prefill
  gather_facts: true
  vars:
    # Stands for the tools venv that appliance_tools creates (NVML facts run with it).
    appliance_tools_python: "{{ ansible_playbook_python }}"
  roles:
    - role: appliance_defaults
    - role: nvidia_driver
    - role: cuda_toolkit
  tasks:
    - name: Keep the facts for the test
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: >-
          {{ {'pd_gpus': pd_gpus, 'driver': pd_gpu_driver_version, 'topology': pd_gpu_pcie} | to_json }}
        mode: "0644"
"""

NO_DRIVER = """
- name: pd_nvml_facts on a machine without a driver
  hosts: prefill
  gather_facts: false
  tasks:
    - name: Gather NVML facts for real
      pd_nvml_facts:
      vars:
        # The controller's venv has pd_appliance and nvidia-ml-py, as the tools venv does.
        ansible_python_interpreter: "{{ ansible_playbook_python }}"
      register: facts
      ignore_errors: true
    - name: Keep the result
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ facts | to_json }}"
        mode: "0644"
"""


def _flat(text: str) -> str:
    """Ansible's YAML callback wraps long messages; compare with whitespace collapsed."""
    return " ".join(text.split())


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_rehearsal_reports_simulated_gpus_and_renders_the_files(
    tmp_path: Path, rehearsal_inventory_copy: Path
) -> None:
    out = tmp_path / "facts.json"
    done = run_playbook(_write(tmp_path, "play.yml", PLAY), rehearsal_inventory_copy, "-e", f"out={out}")
    assert done.returncode == 0, done.stdout[-3000:]
    assert (
        "STAND-IN (nvidia_driver_install=false, standins/declared.yml): this host has no NVIDIA GPU"
        in _flat(done.stdout)
    )
    facts = json.loads(out.read_text())
    # The product's NVML code read them through the stand-in's pynvml-shaped module, which names itself.
    assert len(facts["pd_gpus"]) == 8 and {g["stand_in"] for g in facts["pd_gpus"]} == {standin_nvml.STAND_IN}
    assert f"STAND-IN ({standin_nvml.STAND_IN}): pd_gpus are the 8 GPUs it answers for" in _flat(done.stdout)
    assert [g["cpu_list"] for g in facts["pd_gpus"][3:5]] == ["0-31", "32-63"]
    assert facts["driver"] == "580.159.04"
    assert facts["topology"]["link"][0][7] == "SYS"
    root = rehearsal_inventory_copy.parent.parent / ".rehearsal" / "root"
    sources = (root / "etc/apt/sources.list.d/pd-appliance-cuda.sources").read_text()
    assert "URIs: https://developer.download.nvidia.com/compute/cuda/repos/" in sources
    assert (
        "Pin: version 580.159.04-*"
        in (root / "etc/apt/preferences.d/00-pd-appliance-nvidia-driver.pref").read_text()
    )
    assert "blacklist nouveau" in (root / "etc/modprobe.d/pd-appliance-blacklist-nouveau.conf").read_text()
    profile = (root / "etc/profile.d/pd-appliance-cuda.sh").read_text()
    assert f'export CUDA_HOME="{root}/usr/local/cuda-13.0"' in profile
    # The workers' CUDA_HOME comes from the serving role's env hooks; no unread cuda.env is rendered.
    assert not (root / "etc/pd-appliance/cuda.env").exists()
    second = run_playbook(_write(tmp_path, "play.yml", PLAY), rehearsal_inventory_copy, "-e", f"out={out}")
    assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout[-3000:]


def test_wrong_compute_capability_fails_naming_the_variable(
    tmp_path: Path, rehearsal_inventory_copy: Path
) -> None:
    done = run_playbook(
        _write(tmp_path, "play.yml", PLAY),
        rehearsal_inventory_copy,
        "-e",
        f"out={tmp_path / 'x.json'}",
        "-e",
        "nvidia_driver_expected_compute_capability=9.0",
    )
    assert done.returncode != 0
    assert "compute capabilities 12.0 (expected 9.0)" in _flat(done.stdout)
    assert "nvidia_driver_expected_*" in _flat(done.stdout)


def test_nvml_facts_without_a_driver_names_the_cause(tmp_path: Path, rehearsal_inventory_copy: Path) -> None:
    out = tmp_path / "result.json"
    done = run_playbook(_write(tmp_path, "play.yml", NO_DRIVER), rehearsal_inventory_copy, "-e", f"out={out}")
    assert done.returncode == 0, done.stdout[-3000:]
    result = json.loads(out.read_text())
    assert result["failed"] is True
    # Without a GPU on the PCI bus the cause is no_gpu; a GPU host without a driver says no_driver.
    has_gpu = any(p.read_text().strip() == "0x10de" for p in Path("/sys/bus/pci/devices").glob("*/vendor"))
    expected = "no_driver" if has_gpu else "no_gpu"
    assert result["cause"] == expected and result["fix"]
    assert (ROOT / "plugins/modules/pd_nvml_facts.py").exists()
