"""The fabric checks inside the real plays: preflight on the rehearsal inventory, and the driver
stage's NVML checks on the simulated-GPU stand-in's facts (healthy, then with P2P off across sockets)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from pd_testlib import ansible_env, run_playbook

pytestmark = pytest.mark.slow

FACTS_PLAY = """
- name: NVML facts and the fabric checks on them
  hosts: prefill
  gather_facts: false
  vars:
    appliance_tools_python: "{{ ansible_playbook_python }}"
  roles:
    - role: appliance_defaults
  tasks:
    - name: Facts entry point of the driver role
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: facts
"""


def _flat(text: str) -> str:
    return " ".join(text.split())


def _group_vars(inventory: Path, **values: object) -> None:
    (inventory / "group_vars" / "all" / "zz_fabric.yml").write_text(yaml.safe_dump(values))


def test_preflight_fails_on_expandable_segments_in_a_decode_hook(rehearsal_inventory_copy: Path) -> None:
    # Extra vars: the lab's group_vars/decode.yml (which the rehearsal links) sets serving_env_decode.
    hook = json.dumps({"serving_env_decode": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}})
    done = run_playbook("playbooks/preflight.yml", rehearsal_inventory_copy, "-e", hook)
    out = _flat(done.stdout)
    assert done.returncode != 0, out[-3000:]
    assert "[expandable_segments] serving_env_decode.PYTORCH_CUDA_ALLOC_CONF" in out
    assert "NIXL silently moves KV over TCP" in out
    relaxed = run_playbook(
        "playbooks/preflight.yml",
        rehearsal_inventory_copy,
        "-e",
        hook,
        "-e",
        "preflight_fabric_expandable_segments=warn",
    )
    assert relaxed.returncode == 0, _flat(relaxed.stdout)[-3000:]
    relaxed_out = _flat(relaxed.stdout)
    assert "WARNING: fabric findings that do not stop preflight" in relaxed_out
    # The simulated GPUs' PCI tree is judged for real: healthy, so nothing about IOMMU, ACS or BAR1.
    assert "STAND-IN (PCI tree of the simulated GPUs (pd_standins.sysfs" in relaxed_out
    assert "[acs]" not in relaxed_out and "[iommu]" not in relaxed_out and "[bar1]" not in relaxed_out


def test_driver_stage_runs_the_nvml_checks_on_the_simulated_gpus(
    tmp_path: Path, rehearsal_inventory_copy: Path
) -> None:
    play = tmp_path / "facts.yml"
    play.write_text(textwrap.dedent(FACTS_PLAY))
    healthy = run_playbook(play, rehearsal_inventory_copy)
    assert healthy.returncode == 0, _flat(healthy.stdout)[-3000:]
    assert "TASK [nvidia_driver : Fabric checks from NVML pass]" in healthy.stdout
    # P2P off everywhere: the lab's 16 prefill -> decode pairs all cross sockets (GPUs 0-3 on NUMA
    # node 0, 4-7 on node 1), so each warns with what the NIXL check will require; no failure. The
    # GPU stand-in's NVML (pd_standins.nvml, run by the facts module on this local host) answers so.
    no_p2p = {**ansible_env(), "PD_SIM_P2P_STATUS": "CHIPSET_NOT_SUPPORTED"}
    crossed = run_playbook(play, rehearsal_inventory_copy, env=no_p2p)
    out = _flat(crossed.stdout)
    assert crossed.returncode == 0, out[-3000:]
    assert "WARNING: 16 fabric finding(s) from NVML" in out
    assert (
        "[p2p_cross_socket] GPU 0 (prefill) -> GPU 4 (decode): NVML reports P2P write CHIPSET_NOT_SUPPORTED"
        in out
    )
    # This host has no checkpoint config.json here, so the KV need is unknown, and the warning says
    # what the NIXL check does about a host-staged path then.
    assert "KV need unknown" in out and "fails that path unless nixl_check_min_bandwidth_gb_s" in out
    failed = run_playbook(
        play, rehearsal_inventory_copy, "-e", "nvidia_driver_fabric_p2p_cross_socket=fail", env=no_p2p
    )
    out = _flat(failed.stdout)
    assert failed.returncode != 0
    assert "The GPU fabric cannot carry PD (16 problem(s))" in out
