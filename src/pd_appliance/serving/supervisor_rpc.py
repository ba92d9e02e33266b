"""supervisord extension: apply a changed program without restarting its whole group.

Stock `supervisorctl update` treats a group as the unit: change one program of `pd` and it stops,
removes and re-adds the group, bouncing prefill, decode and router together (minutes of model
loading for nothing). This RPC namespace (registered in supervisord.conf as
`[rpcinterface:pd_appliance]`) lets pd_appliance.serving.apply swap the config of just the
programs whose section changed, after `supervisor.reloadConfig()` has read the files.
"""

from __future__ import annotations

from typing import Any

from supervisor.options import ProcessGroupConfig
from supervisor.states import STOPPED_STATES, SupervisorStates
from supervisor.xmlrpc import Faults, RPCError

API_VERSION = "1.0"


class PdApplianceNamespace:
    """XML-RPC methods under `pd_appliance.`."""

    def __init__(self, supervisord: Any) -> None:
        self.supervisord = supervisord

    def _check_state(self) -> None:
        if self.supervisord.options.mood < SupervisorStates.RUNNING:
            raise RPCError(Faults.SHUTDOWN_STATE)

    def _new_group_config(self, group_name: str) -> ProcessGroupConfig:
        for config in self.supervisord.options.process_group_configs:
            if config.name == group_name:
                return config
        raise RPCError(Faults.BAD_NAME, f"group {group_name} is not in the configuration files")

    def _group(self, group_name: str) -> Any:
        group = self.supervisord.process_groups.get(group_name)
        if group is None:
            raise RPCError(Faults.BAD_NAME, f"group {group_name} is not active")
        return group

    def getAPIVersion(self) -> str:
        """@return string version of this namespace."""
        return API_VERSION

    def diffProcesses(self, group_name: str) -> dict[str, list[str]]:
        """Compare the active programs of a group with the configuration last read by reloadConfig.

        @param string group_name
        @return struct {added, changed, removed, order}: program names, in priority order; order
            lists every configured program of the group by priority (workers before the router)
        """
        self._check_state()
        group = self._group(group_name)
        new = {p.name: p for p in self._new_group_config(group_name).process_configs}
        active = group.processes
        by_priority = sorted(new.values(), key=lambda p: (p.priority, p.name))
        return {
            "added": [p.name for p in by_priority if p.name not in active],
            "changed": [p.name for p in by_priority if p.name in active and active[p.name].config != p],
            "removed": sorted(name for name in active if name not in new),
            "order": [p.name for p in by_priority],
        }

    def _sync_group_config(self, group: Any, new_group: ProcessGroupConfig) -> None:
        ordered = [
            group.processes[p.name].config for p in new_group.process_configs if p.name in group.processes
        ]
        new_names = {p.name for p in new_group.process_configs}
        ordered += [proc.config for name, proc in group.processes.items() if name not in new_names]
        group.config = ProcessGroupConfig(new_group.options, new_group.name, new_group.priority, ordered)

    def replaceProcess(self, group_name: str, process_name: str) -> bool:
        """Replace (or add) one stopped program with its newly read config; autostart programs start.

        @param string group_name
        @param string process_name
        @return boolean True
        """
        self._check_state()
        group = self._group(group_name)
        new_group = self._new_group_config(group_name)
        config = next((p for p in new_group.process_configs if p.name == process_name), None)
        if config is None:
            raise RPCError(Faults.BAD_NAME, f"{group_name}:{process_name} is not in the configuration files")
        _must_be_stopped(group_name, process_name, group.processes.get(process_name))
        config.create_autochildlogs()
        group.processes[process_name] = config.make_process(group)
        self._sync_group_config(group, new_group)
        return True

    def removeProcess(self, group_name: str, process_name: str) -> bool:
        """Remove one stopped program that is no longer in the configuration.

        @param string group_name
        @param string process_name
        @return boolean True
        """
        self._check_state()
        group = self._group(group_name)
        old = group.processes.get(process_name)
        if old is None:
            raise RPCError(Faults.BAD_NAME, f"{group_name}:{process_name}")
        _must_be_stopped(group_name, process_name, old)
        del group.processes[process_name]
        self._sync_group_config(group, self._new_group_config(group_name))
        return True


def _must_be_stopped(group_name: str, process_name: str, process: Any) -> None:
    """Refuse to replace or remove a program that still runs: supervisor would lose track of it."""
    if process is not None and process.get_state() not in STOPPED_STATES:
        raise RPCError(Faults.STILL_RUNNING, f"{group_name}:{process_name} must be stopped first")


def make_rpcinterface(supervisord: Any, **config: Any) -> PdApplianceNamespace:
    """Factory named by `supervisor.rpcinterface_factory` in supervisord.conf."""
    return PdApplianceNamespace(supervisord)
