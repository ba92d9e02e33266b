#!/usr/bin/python
"""Ansible module: the pd_sglang_versions fact (logic in pd_appliance.sglang_versions)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_sglang_versions
short_description: Record the SGLang venv's component versions as host facts
description:
  - Reads the SGLang venv's package metadata (no import of torch, no GPU needed) and sets
    C(pd_sglang_versions) (sglang, torch, cuda, flashinfer, sgl-kernel, nixl, triton, pd-kernels;
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
  state:
    description:
      - >-
        Also return C(state_digest), the digest of what the install, patch and verify steps leave
        in the venv (pd_appliance.sglang_versions.state_digest): its dist-info RECORDs, the patch
        marker and the files it lists, and I(state_files).
    type: bool
    default: false
  patch_marker:
    description: The patch series' marker (with I(state)).
    type: path
  state_files:
    description: The role's own stamps that belong to the venv's state (with I(state)).
    type: list
    elements: path
    default: []
  proof_record:
    description:
      - >-
        A proof record to read in the same run (pd_appliance.proofs), returned as C(proof_record)
        shaped like M(ansible.builtin.slurp)'s result (empty when the file does not exist).
    type: path
author: pd-appliance
"""

EXAMPLES = r"""
- name: Record SGLang component versions
  pd_sglang_versions:
    venv: /opt/pd-appliance/sglang
    required: [sglang, torch, cuda, flashinfer, sgl-kernel, nixl]
"""

RETURN = r"""
ansible_facts:
  description: pd_sglang_versions and pd_sglang_versions_missing.
  type: dict
  returned: success
state_digest:
  description: The venv's state digest (with I(state)).
  type: str
  returned: when state is true
proof_record:
  description: "I(proof_record)'s content, base64 (C(content)), or {} when absent."
  type: dict
  returned: when proof_record is given
"""

from pathlib import Path  # noqa: E402  (Ansible wants DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "required": {"type": "list", "elements": "str", "default": []},
            "state": {"type": "bool", "default": False},
            "patch_marker": {"type": "path"},
            "state_files": {"type": "list", "elements": "path", "default": []},
            "proof_record": {"type": "path"},
        },
        supports_check_mode=True,
    )
    with tools_venv(module):
        from pd_appliance.proofs import read_record_slurped
        from pd_appliance.sglang_versions import COMPONENTS, collect, state_digest
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
    extra = {}
    params = module.params
    if params["state"]:
        marker = Path(params["patch_marker"]) if params["patch_marker"] else None
        extra["state_digest"] = state_digest(
            Path(params["venv"]), marker, [Path(p) for p in params["state_files"]]
        )
    if params["proof_record"]:
        extra["proof_record"] = read_record_slurped(Path(params["proof_record"]))
    module.exit_json(changed=False, ansible_facts=facts, site_packages=found["site_packages"], **extra)


if __name__ == "__main__":
    main()
