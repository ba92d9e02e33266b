#!/usr/bin/python
"""Ansible module pd_venv_state: venvs' install state and a proof record, in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_venv_state
short_description: The install state of one or more venvs as a digest, and a proof record read with it
description:
  - Returns C(state_digest), one digest over each venv's pyvenv.cfg and every dist-info's RECORD
    (pd_appliance.supply.venv_state), so a role can skip installers whose inputs and venvs did not
    change since the last passed run (pd_appliance.proofs), and C(proof_record), that run's record,
    read in the same module run.
  - Needs pd_appliance in the interpreter; run it with the tools venv
    (C(ansible_python_interpreter={{ appliance_tools_python }})).
options:
  venvs:
    description: The venvs, in a fixed order.
    type: list
    elements: path
    required: true
  proof_record:
    description: The proof record to read, returned shaped like M(ansible.builtin.slurp)'s result.
    type: path
    required: true
  locks:
    description:
      - >-
        Hashed locks on the host whose packages are the venvs' state (with I(packages)); empty
        (and no I(packages)): every installed package counts.
    type: list
    elements: path
    default: []
  packages:
    description: More package names that count (installed from outside the locks).
    type: list
    elements: str
    default: []
author: pd-appliance
"""

EXAMPLES = r"""
- name: Read the tools and router venvs' state and their proof record
  pd_venv_state:
    venvs: [/opt/pd-appliance/tools, /opt/pd-appliance/router]
    proof_record: /var/lib/pd-appliance/proofs/tools-venvs.json
"""

RETURN = r"""
state_digest:
  description: The venvs' state digest.
  type: str
  returned: success
proof_record:
  description: "The record's content, base64 (C(content)), or {} when it does not exist."
  type: dict
  returned: success
"""

from pathlib import Path  # noqa: E402  (Ansible wants DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "venvs": {"type": "list", "elements": "path", "required": True},
            "proof_record": {"type": "path", "required": True},
            "locks": {"type": "list", "elements": "path", "default": []},
            "packages": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    with tools_venv(module, "pd_appliance is not importable ({err}): run it with the tools venv's Python"):
        from pd_appliance.proofs import read_record_slurped
        from pd_appliance.supply.lock import LockError, read_lock
        from pd_appliance.supply.venv_state import venvs_digest
    params = module.params
    try:
        names = {name for lock in params["locks"] for name in read_lock(Path(lock))} | set(params["packages"])
        digest = venvs_digest([Path(v) for v in params["venvs"]], names or None)
    except (FileNotFoundError, LockError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=False, state_digest=digest, proof_record=read_record_slurped(Path(params["proof_record"]))
    )


if __name__ == "__main__":
    main()
