"""The inventory and host checks the preflight stage runs (plugins/filter/pd_preflight.py wraps them):
everything that can be known wrong before the play changes anything.

Each check returns a list of messages; an empty list means the check passed. Every message names
the variable or host fact at fault and says how to fix it, because the person reading it is in
the middle of a deployment and should not have to read the role to find out what to change.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from pd_appliance.serving import topology

PD_ROLES = ("prefill", "decode", "router")
_PID_RE = re.compile(r"pid=(\d+)")

# Ports the router opens on its host, by the variable that sets them.
ROUTER_PORT_VARIABLES = ("serving_router_port", "serving_router_metrics_port")


def _instances(roles: Sequence[str], variables: Mapping[str, Any]) -> tuple[Any, bool]:
    """The host's instance list and whether it is the per-role default.

    `variables["serving_instances"]` is what the inventory (or -e) set; absent or None means the
    host uses the layout the per-role variables describe, and messages then name those.
    """
    raw = variables.get("serving_instances")
    if raw is None:
        return topology.default_instances(roles, variables), True
    return raw, False


def topology_errors(
    host: str,
    roles: Iterable[str],
    gpu_count: int | None,
    variables: Mapping[str, Any],
) -> list[str]:
    """Check the instances (GPU sets, TP sizes, ports) and the router's ports of one host.

    `variables` holds the host's serving_* values: serving_instances when the inventory sets it,
    else the per-role variables, plus the router's ports. `gpu_count` is None when the host's
    GPUs could not be counted (then only the inventory's own consistency is checked).
    """
    roles = [r for r in roles if r in PD_ROLES]
    raw, per_role = _instances(roles, variables)
    reserved = {v: variables.get(v) for v in ROUTER_PORT_VARIABLES} if "router" in roles else {}
    return topology.problems(host, raw, roles, gpu_count, reserved, per_role=per_role)


def router_mode_errors(layouts: Mapping[str, Any]) -> list[str]:
    """One router mode per deployment: every worker host's instances aggregated, or none.

    `layouts` maps each worker host (groups prefill and decode) to its serving_instances, None
    where the inventory leaves it to the per-role variables (a PD layout).
    """
    by_host = {}
    for host, raw in layouts.items():
        if raw is None:
            unset = "prefill/decode (serving_instances unset: the per-role layout)"
            raw = [{"role": "prefill", "name": unset}]
        by_host[host] = raw
    if any(topology.mode_problems({host: raw}) for host, raw in by_host.items()):
        return []  # a host mixing them says so itself (topology_errors)
    return topology.mode_problems(by_host)


def host_ports(roles: Iterable[str], variables: Mapping[str, Any]) -> dict[str, int]:
    """Every port this host's programs open, by the variable (or serving_instances entry) that sets it."""
    roles = [r for r in roles if r in PD_ROLES]
    raw, per_role = _instances(roles, variables)
    ports: dict[str, int] = {}
    for i, inst in enumerate(topology.published(raw, roles=roles)):
        fields = topology.PER_ROLE_VARIABLES[inst["role"]] if per_role else {}
        for key in ("port", "bootstrap_port"):
            if isinstance(inst.get(key), int):
                label = fields.get(key) or f"{topology.VARIABLE}[{i}].{key} of pd:{inst['name']}"
                ports[label] = inst[key]
    if "router" in roles:
        for variable in ROUTER_PORT_VARIABLES:
            value = variables.get(variable)
            if isinstance(value, int | str) and str(value).strip().isdigit():
                ports[variable] = int(value)
    ports.update(monitoring_ports(variables))
    return ports


def monitoring_ports(variables: Mapping[str, Any]) -> dict[str, int]:
    """The ports the monitor stage opens on this host, by the variable that sets them.

    The monitor group runs under the same supervisord as the workers, so a port another process
    holds makes Prometheus or an exporter crash-loop after the whole deployment has been built.
    `variables` holds the monitoring_* values as the host will see them; `monitoring_on_prometheus_host`
    says whether this host is monitoring_prometheus_host. Absent values open nothing.
    """
    if not truthy(variables.get("monitoring_enabled", False)):
        return {}
    opened = {
        "monitoring_prometheus_port": truthy(variables.get("monitoring_on_prometheus_host", False)),
        "monitoring_node_exporter_port": truthy(variables.get("monitoring_node_exporter_enabled", False)),
        "monitoring_gpu_exporter_port": truthy(variables.get("monitoring_gpu_exporter_enabled", False)),
    }
    ports: dict[str, int] = {}
    for variable, opens in opened.items():
        value = variables.get(variable)
        if opens and isinstance(value, int | str) and str(value).strip().isdigit():
            ports[variable] = int(value)
    return ports


def truthy(value: Any) -> bool:
    """Ansible's truthiness of a templated value ("true", "True", "yes", 1, True)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def memory_errors(
    host: str,
    roles: Iterable[str],
    variables: Mapping[str, Any],
    checkpoint_bytes: int,
    checkpoint_source: str,
    gpu_memory: Any,
    gpu_memory_source: str,
) -> list[str]:
    """Refuse an instance whose TP share of the checkpoint cannot fit one of its GPUs.

    `variables` as for topology_errors, plus serving_mem_fraction_static and the per-role extra
    args (serving_prefill_extra_args, serving_decode_extra_args), which may set the fraction.
    """
    roles = [r for r in roles if r in PD_ROLES]
    raw, _ = _instances(roles, variables)
    return topology.memory_fit_errors(
        topology.published(raw, host, roles=roles),
        host,
        checkpoint_bytes,
        checkpoint_source,
        gpu_memory,
        gpu_memory_source,
        variables["serving_mem_fraction_static"],
        {role: variables.get(f"serving_{role}_extra_args") or [] for role in topology.WORKER_ROLES},
    )


def missing_variable_errors(host: str, required: Iterable[str], values: Mapping[str, Any]) -> list[str]:
    """Required variables must be defined and non-empty (a blank SET placeholder counts as missing)."""
    errors = []
    for name in required:
        value = values.get(name)
        if value is None or (isinstance(value, str | list | dict) and len(value) == 0):
            errors.append(
                f"{host}: required variable {name} is not set. Set it in the inventory's group_vars "
                f"(see the comment marked SET next to it in inventory/lab/group_vars)."
            )
    return errors


def mount_for(path: str, mounts: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The mount that holds `path`: the one with the longest mount point that is a prefix of it."""
    target = PurePosixPath(path)
    best: Mapping[str, Any] | None = None
    for mount in mounts:
        point = PurePosixPath(str(mount.get("mount", "")))
        if (target == point or point in target.parents) and (
            best is None or len(str(point)) > len(str(best["mount"]))
        ):
            best = mount
    return best


def disk_errors(
    host: str,
    path: str,
    mounts: Iterable[Mapping[str, Any]],
    needed_bytes: int,
    present_bytes: int = 0,
) -> list[str]:
    """The checkpoint's filesystem must have room for what is not already downloaded."""
    mount = mount_for(path, mounts)
    if mount is None:
        return [f"{host}: no mounted filesystem holds appliance_model_dir={path}; check the path."]
    missing = max(int(needed_bytes) - int(present_bytes), 0)
    available = int(mount.get("size_available", 0))
    if available < missing:
        return [
            f"{host}: {mount['mount']} has {_gib(available)} free, but the checkpoint needs "
            f"{_gib(missing)} more "
            f"(checkpoint_size_bytes={needed_bytes}, {_gib(present_bytes)} already in {path}). Free space, "
            f"or point appliance_model_dir at a larger filesystem."
        ]
    return []


def _gib(n: int | float) -> str:
    return f"{float(n) / 2**30:.1f} GiB"


def os_errors(
    host: str, distribution: str, version: str, supported: Mapping[str, Sequence[str]]
) -> list[str]:
    """Only the distributions the driver role knows how to provision are accepted."""
    versions = [str(v) for v in supported.get(distribution, [])]
    if str(version) in versions:
        return []
    listed = ", ".join(f"{name} {'/'.join(map(str, v))}" for name, v in supported.items())
    return [
        f"{host}: {distribution} {version} is not supported (supported: {listed}). Reinstall the host with a "
        f"supported OS, or extend preflight_supported_os only after the driver role supports it."
    ]


def pci_gpu_count(pci_devices: Iterable[Mapping[str, str]]) -> int:
    """Count NVIDIA display/3D controllers from sysfs (vendor 0x10de, class 0x0300xx or 0x0302xx).

    This works before any driver is installed, which is when preflight runs on a new host.
    """
    return sum(
        1
        for dev in pci_devices
        if dev.get("vendor", "").strip().lower() == "0x10de"
        and dev.get("class", "").strip().lower()[:6] in ("0x0300", "0x0302")
    )


def is_documentation_address(address: str) -> bool:
    """True for the RFC 5737 example ranges the lab inventory ships with."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(
        ip in ipaddress.ip_network(net) for net in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
    )


# --------------------------------------------------------------------------- networking


WILDCARD_ADDRESSES = ("0.0.0.0", "::")


def address_errors(
    host: str, variable: str, value: Any, host_addresses: Iterable[str], *, wildcard_ok: bool = False
) -> list[str]:
    """`value` (an address the host must listen on or be reached at) must be one of the host's own.

    A worker that binds an address the host lacks never starts; one that binds loopback while the
    router dials the host's network address refuses every connection. Both are found here, before
    anything is installed, rather than as a health timeout half an hour into the serve stage.
    """
    own = sorted({str(a) for a in host_addresses} | {"127.0.0.1", "::1"})
    text = str(value or "").strip()
    if not text:
        return [
            f"{host}: {variable} is empty: the host has no default IPv4 route to take its address from. "
            f"Set {variable} in host_vars/{host}.yml to one of its addresses: {', '.join(own)}."
        ]
    if wildcard_ok and text in WILDCARD_ADDRESSES:
        return []
    try:
        wanted = ipaddress.ip_address(text)
    except ValueError:
        return [
            f"{host}: {variable}={text} is not an IP address; set it to one of the host's addresses: "
            f"{', '.join(own)}."
        ]
    if any(ipaddress.ip_address(a) == wanted for a in own if _is_ip(a)):
        return []
    return [
        f"{host}: {variable}={text} is not an address of this host (it has {', '.join(own)}); what the "
        f"workers bind and what the router dials must be the host's own. Set {variable} in "
        f"host_vars/{host}.yml to one of them."
    ]


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def parse_listeners(ss_lines: Iterable[str]) -> list[dict[str, Any]]:
    """Listening TCP sockets from `ss -Htlnp` lines: address, port and the pids ss could name."""
    listeners = []
    for line in ss_lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        address, _, port = local.rpartition(":")
        if not port.isdigit():
            continue
        pids = [int(p) for p in _PID_RE.findall(line)]
        listeners.append({"address": address.strip("[]").split("%")[0], "port": int(port), "pids": pids})
    return listeners


def parse_processes(ps_lines: Iterable[str]) -> dict[int, dict[str, Any]]:
    """`ps -eo pid=,ppid=,args=` lines as {pid: {"ppid": int, "args": str}}."""
    processes: dict[int, dict[str, Any]] = {}
    for line in ps_lines:
        fields = line.split(None, 2)
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            processes[int(fields[0])] = {"ppid": int(fields[1]), "args": fields[2] if len(fields) > 2 else ""}
    return processes


def _descends_from(pid: int, ancestor: int, processes: Mapping[int, Mapping[str, Any]]) -> bool:
    seen: set[int] = set()
    while pid in processes and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        pid = int(processes[pid]["ppid"])
    return pid == ancestor


def supervisord_errors(
    host: str, config: str, own_pid: int | None, processes: Mapping[int, Mapping[str, Any]]
) -> list[str]:
    """At most one supervisord may run this deployment's config, and it must be the recorded one.

    A second one (started after its pidfile or socket was deleted) keeps its programs on the ports,
    and the next deploy's health checks would be answered by them.
    """
    strays = sorted(
        pid
        for pid, proc in processes.items()
        if "supervisord" in str(proc["args"]) and config in str(proc["args"]) and pid != own_pid
    )
    if not strays:
        return []
    return [
        f"{host}: supervisord pid {pid} runs this deployment's config {config} but is not the one its "
        f"pidfile records ({own_pid or 'no pidfile'}): its programs would answer for this deployment. "
        f"Stop it (`kill {pid}`, or `make stop` before deleting a rehearsal tree), then re-run."
        for pid in strays
    ]


def listener_errors(
    host: str,
    ports: Mapping[str, int],
    listeners: Iterable[Mapping[str, Any]],
    processes: Mapping[int, Mapping[str, Any]],
    own_supervisord: int | None,
) -> list[str]:
    """Every port this host's programs open must be free or held by this deployment's own programs.

    `ports` maps the variable that sets a port to its value; `own_supervisord` is the pid of this
    deployment's supervisord (None when it does not run): a holder that descends from it is ours.
    """
    errors = []
    for variable, port in sorted(ports.items()):
        for listener in listeners:
            if int(listener["port"]) != int(port):
                continue
            pids = list(listener.get("pids") or [])
            ours = [p for p in pids if own_supervisord and _descends_from(p, own_supervisord, processes)]
            if ours and len(ours) == len(pids):
                continue
            if not pids:
                holder = "a process this account cannot see (run preflight with become to name it)"
            else:
                holder = ", ".join(
                    f"pid {p} ({str(processes.get(p, {}).get('args', '?'))[:120]})" for p in pids
                )
            errors.append(
                f"{host}: port {port} ({variable}) is already held on {listener['address']} by {holder}, "
                f"which is not this deployment's own program. Stop that process or choose another {variable}."
            )
            break
    return errors


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
# sun_path holds 108 bytes with its terminating NUL: the longest unix socket path bind() takes.
UNIX_SOCKET_PATH_MAX = 107


def secret_errors(
    host: str,
    worker_host: bool,
    bind_host: str,
    require_api_key: bool,
    api_key_set: bool,
    inet_port: int,
    inet_password_set: bool,
) -> list[str]:
    """Nothing that runs a model or supervisor's RPC may be reachable beyond loopback without a secret.

    Workers bound beyond loopback answer anyone who reaches the address: they must require the
    router's key (serving_worker_require_api_key) and the key must be set. supervisor's HTTP server
    (serving_supervisor_inet_port > 0) can start and stop programs: it needs a password. Only
    whether the secrets are set is passed in: preflight never holds their values.
    """
    errors = []
    beyond_loopback = worker_host and str(bind_host).strip() not in LOOPBACK_HOSTS
    if beyond_loopback and (not require_api_key or not api_key_set):
        why = (
            "serving_worker_require_api_key is false"
            if not require_api_key
            else "serving_router_api_key is empty"
        )
        errors.append(
            f"{host}: the workers listen on {bind_host} (beyond loopback) but {why}: anyone who reaches "
            f"that address could use them. Set serving_worker_require_api_key: true and give "
            f"serving_router_api_key (ansible-vault), or bind them to 127.0.0.1 on a single host."
        )
    if int(inet_port or 0) > 0 and not inet_password_set:
        errors.append(
            f"{host}: serving_supervisor_inet_port={inet_port} opens supervisor's HTTP server without a "
            f"password: set serving_supervisor_inet_password (ansible-vault) or the port to 0."
        )
    return errors


def socket_path_errors(host: str, path: str) -> list[str]:
    """supervisord's control socket must fit a unix socket's path, or supervisord cannot start."""
    length = len(str(path).encode())
    if length <= UNIX_SOCKET_PATH_MAX:
        return []
    return [
        f"{host}: the supervisor control socket {path} is {length} bytes long; a unix socket path holds at "
        f"most {UNIX_SOCKET_PATH_MAX}, so supervisord could not start. Shorten appliance_root "
        f"(or serving_supervisor_run_dir)."
    ]
