#!/usr/bin/python
"""Ansible module nvml_facts: the GPUs as NVML and sysfs see them (logic in pd_appliance.gpu)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nvml_facts
short_description: GPU facts from NVML (nvidia-ml-py) and sysfs, or simulated GPUs in rehearsal
description:
  - Sets C(pd_gpus) (one dict per GPU, keys as in CONTRIBUTING.md "Facts"), C(pd_gpu_driver_version),
    C(pd_gpu_cuda_version) and C(pd_gpu_topology) (link and P2P matrices).
  - On a host whose driver is broken it fails with C(cause) (no_driver, no_gpu, secure_boot_unsigned_module,
    module_not_loaded, driver_version_mismatch, gpu_fell_off_bus), C(detail) and C(fix).
  - Needs pd_appliance and nvidia-ml-py in the interpreter; run it with the tools venv
    (C(ansible_python_interpreter={{ appliance_tools_python }})).
options:
  simulated_gpus:
    description: GPUs to report instead of NVML (rehearsal); each must carry C(simulated=true).
    type: list
    elements: dict
    default: []
  simulated_driver_version:
    description: Driver version reported with I(simulated_gpus).
    type: str
    default: simulated
  simulated_cuda_version:
    description: CUDA version reported with I(simulated_gpus).
    type: str
    default: simulated
  sysfs_root:
    description: Where sysfs is mounted (tests point it at a tree of their own).
    type: path
    default: /sys
"""

EXAMPLES = r"""
- name: Gather GPU facts
  nvml_facts:
  vars:
    ansible_python_interpreter: "{{ appliance_tools_python }}"
"""

RETURN = r"""
ansible_facts:
  description: pd_gpus, pd_gpu_driver_version, pd_gpu_cuda_version, pd_gpu_topology.
  returned: success
  type: dict
"""

import sys  # noqa: E402 - Ansible wants DOCUMENTATION first
from pathlib import Path  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def main() -> None:
    """Parse arguments, gather (or simulate) the facts, exit."""
    module = AnsibleModule(
        argument_spec={
            "simulated_gpus": {"type": "list", "elements": "dict", "default": []},
            "simulated_driver_version": {"type": "str", "default": "simulated"},
            "simulated_cuda_version": {"type": "str", "default": "simulated"},
            "sysfs_root": {"type": "path", "default": "/sys"},
        },
        supports_check_mode=True,
    )
    try:
        from pd_appliance.gpu import GpuFactsError, gather_gpu_facts, simulated_facts
        from pd_appliance.gpu.diagnose import HostProbe
    except ImportError as err:
        module.fail_json(
            msg=f"pd_appliance is not importable by {sys.executable} ({err}): run nvml_facts with the tools "
            "venv (ansible_python_interpreter: appliance_tools_python) after the appliance_tools role.",
            cause="tools_missing",
        )
    params = module.params
    try:
        if params["simulated_gpus"]:
            facts = simulated_facts(
                params["simulated_gpus"], params["simulated_driver_version"], params["simulated_cuda_version"]
            )
        else:
            facts = gather_gpu_facts(probe=HostProbe(sysfs_root=Path(params["sysfs_root"])))
    except GpuFactsError as err:
        module.fail_json(msg=str(err), **err.as_dict())
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
