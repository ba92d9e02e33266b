#!/usr/bin/python
"""Ansible module pd_nvml_facts: the GPUs as NVML and sysfs see them (logic in pd_appliance.gpu)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_nvml_facts
short_description: GPU facts from NVML (nvidia-ml-py) and sysfs
description:
  - Sets C(pd_gpus) (one dict per GPU, keys as in CONTRIBUTING.md "Facts"), C(pd_gpu_driver_version),
    C(pd_gpu_cuda_version) and C(pd_gpu_pcie) (link and P2P matrices).
  - On a host whose driver is broken it fails with C(cause) (no_driver, no_gpu, secure_boot_unsigned_module,
    module_not_loaded, driver_version_mismatch, gpu_fell_off_bus), C(detail) and C(fix).
  - Needs pd_appliance and nvidia-ml-py in the interpreter; run it with the tools venv
    (C(ansible_python_interpreter={{ appliance_tools_python }})).
  - Where the NVML module says what it stands in as (its C(STAND_IN)), every GPU carries that as C(stand_in).
options:
  nvml_module:
    description: The pynvml-shaped module NVML is read through (a declared stand-in's where one answers).
    type: str
    default: pynvml
  nvml_path:
    description: A directory put first on the import path for I(nvml_module) (empty for none).
    type: str
    default: ""
  sysfs_root:
    description: Where sysfs is mounted (tests point it at a tree of their own).
    type: path
    default: /sys
"""

EXAMPLES = r"""
- name: Gather GPU facts
  pd_nvml_facts:
  vars:
    ansible_python_interpreter: "{{ appliance_tools_python }}"
"""

RETURN = r"""
ansible_facts:
  description: pd_gpus, pd_gpu_driver_version, pd_gpu_cuda_version, pd_gpu_pcie.
  returned: success
  type: dict
"""

from pathlib import Path  # noqa: E402 - Ansible wants DOCUMENTATION first

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def main() -> None:
    """Parse arguments, gather the facts, exit."""
    module = AnsibleModule(
        argument_spec={
            "nvml_module": {"type": "str", "default": "pynvml"},
            "nvml_path": {"type": "str", "default": ""},
            "sysfs_root": {"type": "path", "default": "/sys"},
        },
        supports_check_mode=True,
    )
    with tools_venv(
        module,
        "pd_appliance is not importable by {python} ({err}): run pd_nvml_facts with the "
        "tools venv (ansible_python_interpreter: appliance_tools_python) after the appliance_tools role.",
        cause="tools_missing",
    ):
        from pd_appliance.gpu import GpuFactsError, gather_gpu_facts, load_nvml
        from pd_appliance.gpu.diagnose import HostProbe
    params = module.params
    try:
        nvml = load_nvml(params["nvml_module"], params["nvml_path"])
        facts = gather_gpu_facts(nvml, probe=HostProbe(sysfs_root=Path(params["sysfs_root"])))
    except GpuFactsError as err:
        module.fail_json(msg=str(err), **err.as_dict())
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
