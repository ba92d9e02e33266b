"""Action plugin pd_host_state: runs the module, then hands the run the state it wrote.

Facts are gathered once a run (playbooks/facts.yml), so without this a play after the write would
read the state the run started with. A module's ansible_facts replace each top-level fact whole,
and ansible_local holds every local fact of the host: the new ansible_local is the one in memory
with only pd_appliance replaced, which only the controller side (this plugin) can see.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

# The controller imports pd_appliance as the filters do (plugins/callback/pd_plugin_preload.py makes
# it importable for an ansible-playbook installed outside the checkout's venv).
from pd_appliance.host_state import FACT_NAME


class ActionModule(ActionBase):  # type: ignore[misc]
    """pd_host_state with the in-memory fact kept in step."""

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        result.update(self._execute_module(module_name="pd_host_state", task_vars=task_vars))
        if result.get("failed") or "host_state" not in result:
            return result
        delegated = self._task.delegate_to
        if delegated and not self._task.delegate_facts:
            return result  # the facts would land on the inventory host, not on the one written
        owner = (task_vars.get("hostvars") or {}).get(delegated, {}) if delegated else task_vars
        local = owner.get("ansible_local") or {}
        result["ansible_facts"] = {"ansible_local": {**local, FACT_NAME: result["host_state"]}}
        return result
