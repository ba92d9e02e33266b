#!/usr/bin/python
"""Ansible module pd_host_state: the one writer of the host-state fact (logic in pd_appliance.host_state)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_host_state
short_description: Set keys of the host-state local fact (ansible_local.pd_appliance)
description:
  - The host's state (the release in force and the newest accepted one, the adopted tuning variant,
    the commit each checkpoint branch resolved to) is one JSON local fact,
    I(facts_dir)/pd_appliance.fact, that fact gathering returns as C(ansible_local.pd_appliance)
    (pd_appliance.host_state).
  - Sets the keys in I(values) and drops those in I(remove); every other key is kept, so each writer
    touches only its own. The file is written only when it changes, through a temporary file renamed
    over it, mode 0644, owned by the user the module runs as (root on a lab).
  - The action plugin of the same name returns the new state as C(ansible_local.pd_appliance), so the
    rest of the run reads what was written without gathering again (with delegate_to, when
    delegate_facts is set).
  - Supports check mode (reports what would change, writes nothing). Needs pd_appliance in the
    interpreter; run it with the tools venv.
options:
  facts_dir:
    description: The local facts directory (appliance_local_facts_dir).
    type: path
    required: true
  values:
    description: "Top-level keys to set: release, variant, checkpoint."
    type: dict
    default: {}
  remove:
    description: Top-level keys to drop.
    type: list
    elements: str
    default: []
author: pd-appliance
"""

EXAMPLES = r"""
- name: Record the adopted variant in the host state
  pd_host_state:
    facts_dir: "{{ appliance_local_facts_dir }}"
    values:
      variant: {name: mtp-1, vars: {serving_speculative_algorithm: EAGLE}, env_hooks: {}}
  vars:
    ansible_python_interpreter: "{{ appliance_tools_python }}"
"""

RETURN = r"""
host_state:
  description: The whole host state after the update (what ansible_local.pd_appliance holds).
  type: dict
  returned: success
fact_file:
  description: The fact file.
  type: str
  returned: success
"""

from pathlib import Path  # noqa: E402 - Ansible wants DOCUMENTATION first

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "facts_dir": {"type": "path", "required": True},
            "values": {"type": "dict", "default": {}},
            "remove": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    with tools_venv(
        module,
        "pd_appliance is not importable by {python} ({err}): run pd_host_state with the"
        " tools venv (ansible_python_interpreter: appliance_tools_python)",
    ):
        from pd_appliance import host_state
    path = host_state.fact_path(Path(module.params["facts_dir"]))
    try:
        done = host_state.update(
            path, module.params["values"], module.params["remove"], dry_run=module.check_mode
        )
    except host_state.HostStateError as err:
        module.fail_json(msg=str(err), fact_file=str(path))
    module.exit_json(
        changed=done.changed,
        host_state=done.after,
        fact_file=str(path),
        diff={
            "before": done.before,
            "after": done.after,
            "before_header": str(path),
            "after_header": str(path),
        },
    )


if __name__ == "__main__":
    main()
