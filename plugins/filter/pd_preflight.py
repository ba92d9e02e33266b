"""Preflight filters: thin wrappers over pd_appliance.host_checks (see that module for the rules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pd_appliance import host_checks


def pd_preflight_topology_errors(
    variables: dict[str, Any], host: str, roles: list[str], gpu_count: Any
) -> list[str]:
    count = None if gpu_count in (None, "") else int(gpu_count)
    return host_checks.topology_errors(host, roles, count, variables)


def pd_preflight_router_mode_errors(layouts: dict[str, Any]) -> list[str]:
    return host_checks.router_mode_errors(layouts)


def pd_preflight_missing_errors(values: dict[str, Any], host: str, required: list[str]) -> list[str]:
    return host_checks.missing_variable_errors(host, required, values)


def pd_preflight_disk_errors(
    mounts: list[dict[str, Any]], host: str, path: str, needed: Any, present: Any = 0
) -> list[str]:
    return host_checks.disk_errors(host, path, mounts, int(needed), int(present or 0))


def pd_preflight_os_errors(
    supported: dict[str, list[str]], host: str, distribution: str, version: str
) -> list[str]:
    return host_checks.os_errors(host, distribution, version, supported)


def pd_pci_gpu_count(lines: list[str]) -> int:
    """Parse 'vendor class' lines (one PCI device each) as printed by the preflight task."""
    devices = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            devices.append({"vendor": parts[0], "class": parts[1]})
    return host_checks.pci_gpu_count(devices)


def pd_argument_errors(result: dict[str, Any]) -> list[str]:
    """Turn one item of the looped validate_argument_spec (its `item` is the role) into messages that
    name the role whose variable is bad."""
    return [f"role {result.get('item')}: {err}" for err in result.get("argument_errors", [])]


def pd_roles_with(roles: list[str], roles_dir: str, relative: str) -> list[str]:
    """The roles that ship that file (defaults/main.yml, meta/argument_specs.yml), in order."""
    return [role for role in roles if (Path(roles_dir) / role / relative).is_file()]


def pd_spec_for_inventory(options: dict[str, Any], names_with_defaults: list[str]) -> dict[str, Any]:
    """The argument spec as it applies to inventory values: a defaulted option is not required."""
    return {
        name: {**spec, "required": False} if name in names_with_defaults else spec
        for name, spec in (options or {}).items()
    }


def pd_is_example_address(address: Any) -> bool:
    return host_checks.is_documentation_address(str(address))


def pd_preflight_address_errors(
    value: Any, host: str, variable: str, addresses: list[str], wildcard_ok: bool = False
) -> list[str]:
    return host_checks.address_errors(host, variable, value, addresses, wildcard_ok=wildcard_ok)


def pd_preflight_processes(ps_lines: list[str]) -> dict[int, dict[str, Any]]:
    return host_checks.parse_processes(ps_lines)


def pd_preflight_supervisord_errors(
    processes: dict[int, dict[str, Any]], host: str, config: str, own_pid: Any
) -> list[str]:
    return host_checks.supervisord_errors(host, config, _pid(own_pid), processes)


def pd_preflight_listener_errors(
    processes: dict[int, dict[str, Any]], host: str, ports: dict[str, Any], ss_lines: list[str], own_pid: Any
) -> list[str]:
    listeners = host_checks.parse_listeners(ss_lines)
    return host_checks.listener_errors(
        host, {k: int(v) for k, v in ports.items()}, listeners, processes, _pid(own_pid)
    )


def pd_preflight_host_ports(variables: dict[str, Any], groups: list[str]) -> dict[str, Any]:
    return host_checks.host_ports(groups, variables)


def pd_preflight_secret_errors(values: dict[str, Any], host: str, groups: list[str]) -> list[str]:
    return host_checks.secret_errors(
        host,
        bool(set(groups) & {"prefill", "decode"}),
        str(values.get("serving_worker_bind_host", "")),
        host_checks.truthy(values.get("serving_worker_require_api_key", True)),
        host_checks.truthy(values.get("serving_router_api_key_set", False)),
        int(values.get("serving_supervisor_inet_port") or 0),
        host_checks.truthy(values.get("serving_supervisor_inet_password_set", False)),
    )


def pd_preflight_socket_path_errors(path: str, host: str) -> list[str]:
    return host_checks.socket_path_errors(host, path)


def pd_preflight_memory_errors(
    variables: dict[str, Any],
    host: str,
    roles: list[str],
    checkpoint_bytes: Any,
    checkpoint_source: str,
    gpu_memory: Any,
    gpu_memory_source: str,
) -> list[str]:
    return host_checks.memory_errors(
        host, roles, variables, int(checkpoint_bytes or 0), checkpoint_source, gpu_memory, gpu_memory_source
    )


def _pid(value: Any) -> int | None:
    return int(value) if value not in (None, "", "None") else None


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_preflight_topology_errors": pd_preflight_topology_errors,
            "pd_preflight_router_mode_errors": pd_preflight_router_mode_errors,
            "pd_preflight_missing_errors": pd_preflight_missing_errors,
            "pd_preflight_disk_errors": pd_preflight_disk_errors,
            "pd_preflight_os_errors": pd_preflight_os_errors,
            "pd_pci_gpu_count": pd_pci_gpu_count,
            "pd_argument_errors": pd_argument_errors,
            "pd_roles_with": pd_roles_with,
            "pd_is_example_address": pd_is_example_address,
            "pd_spec_for_inventory": pd_spec_for_inventory,
            "pd_preflight_address_errors": pd_preflight_address_errors,
            "pd_preflight_processes": pd_preflight_processes,
            "pd_preflight_supervisord_errors": pd_preflight_supervisord_errors,
            "pd_preflight_listener_errors": pd_preflight_listener_errors,
            "pd_preflight_host_ports": pd_preflight_host_ports,
            "pd_preflight_memory_errors": pd_preflight_memory_errors,
            "pd_preflight_secret_errors": pd_preflight_secret_errors,
            "pd_preflight_socket_path_errors": pd_preflight_socket_path_errors,
        }
