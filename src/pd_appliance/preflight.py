"""Preflight checks: everything that can be known wrong before the play changes anything.

Each check returns a list of messages; an empty list means the check passed. Every message names
the variable or host fact at fault and says how to fix it, because the person reading it is in
the middle of a deployment and should not have to read the role to find out what to change.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

PD_ROLES = ("prefill", "decode", "router")

# Ports each serving role opens on its host, by the variable that sets them.
ROLE_PORT_VARIABLES: dict[str, tuple[str, ...]] = {
    "prefill": ("serving_prefill_port", "serving_bootstrap_port"),
    "decode": ("serving_decode_port",),
    "router": ("serving_router_port", "serving_router_metrics_port"),
}


def _gpu_set_errors(host: str, variable: str, gpus: Any, gpu_count: int | None) -> list[str]:
    if not isinstance(gpus, Sequence) or isinstance(gpus, str) or not gpus:
        return [f"{host}: {variable} must be a non-empty list of GPU indices, got {gpus!r}."]
    errors = []
    if any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in gpus):
        errors.append(f"{host}: {variable}={list(gpus)} holds a value that is not a GPU index (0, 1, ...).")
        return errors
    duplicates = sorted({g for g in gpus if list(gpus).count(g) > 1})
    if duplicates:
        errors.append(f"{host}: {variable}={list(gpus)} lists GPU {duplicates} more than once.")
    if gpu_count is not None:
        missing = sorted(g for g in gpus if g >= gpu_count)
        if missing:
            errors.append(
                f"{host}: {variable}={list(gpus)} names GPU {missing}, but the host has {gpu_count} GPU(s) "
                f"(indices 0-{gpu_count - 1}). Fix {variable} in the inventory."
            )
    return errors


def _tp_errors(host: str, role: str, gpus: Any, tp_size: Any) -> list[str]:
    variable = f"serving_{role}_tp_size"
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        return [f"{host}: {variable} must be a positive integer, got {tp_size!r}."]
    if isinstance(gpus, Sequence) and not isinstance(gpus, str) and len(gpus) != tp_size:
        return [
            f"{host}: {variable}={tp_size} but serving_{role}_gpus has {len(gpus)} GPU(s) {list(gpus)}: "
            f"TP size must equal the number of GPUs. Set {variable}: {len(gpus)} or give "
            f"serving_{role}_gpus {tp_size} GPUs."
        ]
    return []


def topology_errors(
    host: str,
    roles: Iterable[str],
    gpu_count: int | None,
    variables: Mapping[str, Any],
) -> list[str]:
    """Check the GPU sets, TP sizes and ports of the PD roles `host` carries.

    `variables` holds the host's serving_* values; `gpu_count` is None when the host's GPUs could
    not be counted (then only the inventory's own consistency is checked).
    """
    roles = [r for r in roles if r in PD_ROLES]
    errors: list[str] = []
    gpu_roles = [r for r in roles if r in ("prefill", "decode")]
    for role in gpu_roles:
        gpus = variables.get(f"serving_{role}_gpus")
        errors += _gpu_set_errors(host, f"serving_{role}_gpus", gpus, gpu_count)
        errors += _tp_errors(host, role, gpus, variables.get(f"serving_{role}_tp_size"))
    if len(gpu_roles) == 2:
        prefill = variables.get("serving_prefill_gpus") or []
        decode = variables.get("serving_decode_gpus") or []
        shared = sorted(set(prefill) & set(decode)) if _all_ints(prefill) and _all_ints(decode) else []
        if shared:
            errors.append(
                f"{host}: serving_prefill_gpus={list(prefill)} and serving_decode_gpus={list(decode)} "
                f"share GPU {shared}; prefill and decode on one host need disjoint GPU sets "
                f"(the lab default is [0, 1, 2, 3] and [4, 5, 6, 7])."
            )
    errors += port_errors(host, roles, variables)
    return errors


def _all_ints(values: Any) -> bool:
    return isinstance(values, Sequence) and all(isinstance(v, int) for v in values)


def port_errors(host: str, roles: Iterable[str], variables: Mapping[str, Any]) -> list[str]:
    """Every port opened on one host must be a valid TCP port and used once."""
    errors: list[str] = []
    users: dict[int, list[str]] = defaultdict(list)
    for role in roles:
        for variable in ROLE_PORT_VARIABLES.get(role, ()):
            port = variables.get(variable)
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                errors.append(f"{host}: {variable} must be a TCP port (1-65535), got {port!r}.")
                continue
            if variable not in users[port]:
                users[port].append(variable)
    for port, names in sorted(users.items()):
        if len(names) > 1:
            errors.append(
                f"{host}: port {port} is used by {' and '.join(names)}; each server on a host needs its own "
                f"port. Change one of them in the inventory."
            )
    return errors


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
