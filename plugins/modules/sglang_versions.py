#!/usr/bin/python
"""Ansible module: the pd_sglang_versions fact (logic in pd_appliance.sglang_versions)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_versions
short_description: Record the SGLang venv's component versions as host facts
description:
  - Reads the SGLang venv's package metadata (no import of torch, no GPU needed) and sets
    C(pd_sglang_versions) (sglang, torch, cuda, flashinfer, sgl-kernel, nixl, triton, pd-appliance;
    None where absent) and C(pd_sglang_versions_missing) (the absent ones, by name).
options:
  venv:
    description: The SGLang venv.
    type: path
    required: true
  required:
    description: Components that must be present; the task fails naming the missing ones.
    type: list
    elements: str
    default: []
author: pd-appliance
"""

EXAMPLES = r"""
- name: Record SGLang component versions
  sglang_versions:
    venv: /opt/pd-appliance/sglang
    required: [sglang, torch, cuda, flashinfer, sgl-kernel, nixl]
"""

RETURN = r"""
ansible_facts:
  description: pd_sglang_versions and pd_sglang_versions_missing.
  type: dict
  returned: success
"""

from pathlib import Path  # noqa: E402  (Ansible wants DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "required": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    try:
        from pd_appliance.sglang_versions import COMPONENTS, collect
    except ImportError as exc:
        module.fail_json(
            msg=f"pd_appliance is not importable ({exc}): run the task with the tools venv's Python"
        )
    unknown = sorted(set(module.params["required"]) - set(COMPONENTS) - {"cuda"})
    if unknown:
        module.fail_json(
            msg=f"required names unknown components {unknown}; known: {sorted([*COMPONENTS, 'cuda'])}"
        )
    try:
        found = collect(Path(module.params["venv"]))
    except FileNotFoundError as exc:
        module.fail_json(msg=str(exc))
    facts = {"pd_sglang_versions": found["versions"], "pd_sglang_versions_missing": found["missing"]}
    absent = [name for name in module.params["required"] if name in found["missing"]]
    if absent:
        module.fail_json(
            msg=f"not installed in {module.params['venv']}: {', '.join(absent)}", ansible_facts=facts
        )
    module.exit_json(changed=False, ansible_facts=facts, site_packages=found["site_packages"])


if __name__ == "__main__":
    main()
