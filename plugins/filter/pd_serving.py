"""Serving filters: thin wrappers over pd_appliance.serving (pinning, env hooks, commands, runtime env)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from pd_appliance.serving import (
    commands,
    discovery,
    pinning,
    plan,
    runtime_env,
    supervisor_format,
    topology,
    wait,
)


def _wrap(function: Any) -> Any:
    def filter_(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except ValueError as exc:
            raise AnsibleFilterError(str(exc)) from exc

    filter_.__name__ = function.__name__
    filter_.__doc__ = function.__doc__
    return filter_


def _merge_env(layers: list[Any]) -> dict[str, str]:
    return supervisor_format.merge_env(*layers)


def _topology(raw: Any, host: str, advertise_host: Any, roles: list[str]) -> list[dict[str, Any]]:
    """The published form of a host's serving_instances (never fails: preflight reports problems)."""
    return topology.published(raw, host, str(advertise_host or ""), roles)


def _instances(
    raw: Any, roles: list[str], host: str, advertise_host: Any, reserved_ports: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """A host's serving_instances, checked (every problem in one error), in the published form."""
    found = topology.instances(raw, roles, host, str(advertise_host or ""), reserved_ports)
    return [instance.as_dict() for instance in found]


def _topology_of(hosts: list[str], hostvars: Any) -> list[dict[str, Any]]:
    """Every instance of `hosts`, from their pd_serving_topology facts, in inventory order."""
    out: list[dict[str, Any]] = []
    for host in dict.fromkeys(hosts):
        try:
            published = hostvars[host]["pd_serving_topology"]
        except KeyError:
            published = None
        if published is None:
            raise topology.TopologyError(
                f"the serving instances of {host} are not known in this run (its fact pd_serving_topology is "
                f"set when a play runs on it): run the playbook with every PD host, without --limit"
            )
        out += list(published)
    return out


def _host_states(hosts: list[str], hostvars: Any) -> dict[str, Any]:
    """Each host's state (ansible_local.pd_appliance, gathered by the facts play), None if unknown."""
    states = {}
    for host in dict.fromkeys(hosts):
        try:
            states[host] = (hostvars[host].get("ansible_local") or {}).get("pd_appliance")
        except KeyError:
            states[host] = None
    return states


def _out_of_rotation(hosts: list[str], hostvars: Any) -> list[str]:
    """Which of `hosts` their own host state takes out of rotation (playbooks/day2/drain.yml)."""
    return discovery.out_of_rotation(_host_states(hosts, hostvars))


def _fleet_lines(registered: list[dict[str, Any]], instances: list[dict[str, Any]], hosts: list[str],
                 hostvars: Any) -> list[str]:  # fmt: skip
    """A status line per worker of the fleet (pd_appliance.serving.discovery.fleet_lines)."""
    return discovery.fleet_lines(registered, instances, _host_states(hosts, hostvars))


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_serving_published": _topology,
            "pd_serving_instances": _wrap(_instances),
            "pd_serving_topology_of": _wrap(_topology_of),
            "pd_serving_memory_fit_errors": _wrap(topology.memory_fit_errors),
            "pd_serving_gpu_bindings": _wrap(pinning.gpu_bindings),
            "pd_serving_merge_env": _wrap(_merge_env),
            "pd_serving_supervisor_environment": _wrap(supervisor_format.supervisor_environment),
            "pd_serving_supervisor_command": _wrap(supervisor_format.supervisor_command),
            "pd_serving_env_file": _wrap(supervisor_format.env_file_lines),
            "pd_serving_sglang_argv": _wrap(commands.sglang_argv),
            "pd_serving_router_argv": _wrap(commands.router_argv),
            "pd_serving_worker_url": _wrap(commands.worker_url),
            "pd_serving_admission_wait_errors": _wrap(commands.admission_wait_errors),
            "pd_serving_caches_outside": _wrap(runtime_env.caches_outside),
            "pd_serving_release_caches": _wrap(runtime_env.release_caches),
            "pd_serving_wait_args": _wrap(wait.wait_arguments),
            "pd_serving_program_specs": _wrap(plan.program_specs),
            "pd_serving_discovery_manifest": _wrap(discovery.manifest),
            "pd_serving_listed_before": _wrap(discovery.listed_before),
            "pd_serving_joining_hosts": _wrap(discovery.joining),
            "pd_serving_gate_companions": _wrap(discovery.companions),
            "pd_serving_out_of_rotation": _wrap(_out_of_rotation),
            "pd_serving_fleet_lines": _wrap(_fleet_lines),
            "pd_serving_worker_base_urls": _wrap(plan.worker_base_urls),
            "pd_serving_health_urls": _wrap(plan.health_urls),
            "pd_serving_dial_targets": _wrap(plan.dial_targets),
            "pd_serving_release_programs": _wrap(plan.release_programs),
        }
