"""The serving topology: which SGLang instances each host runs.

A host runs any number of prefill and decode instances, or any number of aggregated ones (never
both), each one supervisor program with its own GPU set, tensor-parallel size and ports. The host
variable `serving_instances` lists them:

    serving_instances:
      - {role: prefill, gpus: [0, 1], tp_size: 2, port: 30000, bootstrap_port: 8998}
      - {role: decode, gpus: [2, 3], tp_size: 2, port: 30001}
      - {role: decode, gpus: [4, 5], tp_size: 2, port: 30002, env: {NAME: value}, extra_args: []}

or, for aggregated replicas (SGLang without --disaggregation-mode: prefill and decode in one engine,
smg in its regular mode routing over them):

    serving_instances:
      - {role: aggregated, gpus: [0, 1, 2, 3], tp_size: 4, port: 30000}
      - {role: aggregated, gpus: [4, 5, 6, 7], tp_size: 4, port: 30001}

An aggregated instance runs on a host of inventory group `prefill` or `decode` (the worker groups:
the groups every stage already reads for the hosts that run SGLang), so a variant can switch a
host's layout between PD and aggregated without changing the inventory's groups. A deployment has
one router mode: every instance of every host aggregated (smg regular mode), or none (PD mode).

Its default (roles/appliance_defaults) is the layout the per-role variables describe
(serving_prefill_gpus, serving_decode_tp_size, serving_bootstrap_port, ...): one prefill and/or one
decode instance, by the host's inventory groups, rendered exactly as before.

What every stage reads is the *published* form, the host fact `pd_serving_topology` (a list of
`Instance.as_dict()`): each instance with its program name, TP size, integer ports and the URL the
router dials. Program names stay readable: `prefill` / `decode` when a host runs one instance of
a role, `decode-0`, `decode-1`, ... (position among that role's entries) when it runs several,
or the entry's own `name` (`<role>` or `<role>-<suffix>`).

`problems` lists everything wrong with a host's list at once (preflight shows them together);
`instances` raises with the same messages (the serving role never renders a broken layout);
`published` never raises (the fact is set in every play, before preflight has spoken).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pd_appliance.serving.commands import worker_url

# Instance roles: the PD ones, and an aggregated engine (prefill and decode in one).
PD_ROLES = ("prefill", "decode")
AGGREGATED = "aggregated"
WORKER_ROLES = (*PD_ROLES, AGGREGATED)
# The inventory groups of the hosts that run SGLang instances (of any role).
WORKER_GROUPS = PD_ROLES
VARIABLE = "serving_instances"
# Keys an entry of serving_instances may have (meta/argument_specs.yml of appliance_defaults
# declares the same set).
ENTRY_KEYS = ("role", "name", "gpus", "tp_size", "port", "bootstrap_port", "env", "extra_args")
_NAME = re.compile(r"^(prefill|decode|aggregated)(-[A-Za-z0-9_]+)?$")
# The per-role variables the default layout is built from, by role and field.
PER_ROLE_VARIABLES: dict[str, dict[str, str]] = {
    "prefill": {
        "gpus": "serving_prefill_gpus",
        "tp_size": "serving_prefill_tp_size",
        "port": "serving_prefill_port",
        "bootstrap_port": "serving_bootstrap_port",
    },
    "decode": {
        "gpus": "serving_decode_gpus",
        "tp_size": "serving_decode_tp_size",
        "port": "serving_decode_port",
    },
}


class TopologyError(ValueError):
    """A host's instances cannot be served; the message names host, variable and fix."""


@dataclass(frozen=True)
class Instance:
    """One SGLang server: a supervisor program `pd:<name>` on its host."""

    role: str
    name: str
    gpus: tuple[int, ...]
    tp_size: int
    port: int
    bootstrap_port: int | None = None
    env: Mapping[str, Any] = field(default_factory=dict)
    extra_args: tuple[Any, ...] = ()
    url: str = ""
    host: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The published form (the `pd_serving_topology` fact): plain lists and dicts."""
        return {
            "role": self.role,
            "name": self.name,
            "gpus": list(self.gpus),
            "tp_size": self.tp_size,
            "port": self.port,
            "bootstrap_port": self.bootstrap_port,
            "env": dict(self.env),
            "extra_args": list(self.extra_args),
            "url": self.url,
            "host": self.host,
        }


# ---- building ------------------------------------------------------------------------------
def default_instances(roles: Iterable[str], values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The layout the per-role variables describe: one instance per PD group the host is in.

    `values` maps the per-role variable names (PER_ROLE_VARIABLES) to their values.
    """
    roles = list(roles)
    out = []
    for role, fields in PER_ROLE_VARIABLES.items():
        if role in roles:
            out.append({"role": role, **{key: values.get(variable) for key, variable in fields.items()}})
    return out


def program_names(raw: Sequence[Any]) -> list[str]:
    """The program name of each entry: its own `name`, else its role, numbered when the role repeats."""
    roles = [entry.get("role") if isinstance(entry, Mapping) else None for entry in raw]
    counts: defaultdict[Any, int] = defaultdict(int)
    for role in roles:
        counts[role] += 1
    seen: dict[Any, int] = defaultdict(int)
    names = []
    for entry, role in zip(raw, roles, strict=True):
        position = seen[role]
        seen[role] += 1
        own = entry.get("name") if isinstance(entry, Mapping) else None
        if own:
            names.append(str(own))
        elif counts[role] == 1:
            names.append(str(role))
        else:
            names.append(f"{role}-{position}")
    return names


def _int(value: Any) -> int | None:
    """An int from an int or a digit string (`-e serving_decode_port=30555` arrives as a string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _gpu_list(value: Any) -> list[int] | None:
    if not isinstance(value, Sequence) or isinstance(value, str):
        return None
    out = [_int(g) for g in value]
    return None if any(g is None for g in out) else [g for g in out if g is not None]


def published(
    raw: Any, host: str = "", advertise_host: str = "", roles: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """Best-effort published form of a host's instances; never raises (see `instances`).

    Entries that are not dicts with a worker role, or whose role is not one of `roles` (the
    host's groups, when given), are left out; fields that are not numbers stay as they are.
    """
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        return []
    allowed = set(WORKER_ROLES) if roles is None else allowed_roles(roles)
    out = []
    for entry, name in zip(raw, program_names(raw), strict=True):
        if not isinstance(entry, Mapping) or entry.get("role") not in allowed:
            continue
        gpus = _gpu_list(entry.get("gpus")) or []
        port = _int(entry.get("port"))
        tp_size = _int(entry.get("tp_size"))
        out.append(
            {
                "role": entry["role"],
                "name": name,
                "gpus": gpus,
                "tp_size": tp_size if tp_size is not None else len(gpus),
                "port": port if port is not None else entry.get("port"),
                "bootstrap_port": _int(entry.get("bootstrap_port")) if entry["role"] == "prefill" else None,
                "env": dict(entry.get("env") or {}) if isinstance(entry.get("env") or {}, Mapping) else {},
                "extra_args": list(entry.get("extra_args") or []),
                "url": worker_url(advertise_host, port) if advertise_host and port is not None else "",
                "host": host,
            }
        )
    return out


def allowed_roles(groups: Iterable[str]) -> set[str]:
    """The instance roles a host of these inventory groups may run: its PD groups' roles, and
    aggregated on any worker host (group prefill or decode)."""
    groups = set(groups)
    out = groups & set(PD_ROLES)
    return out | {AGGREGATED} if groups & set(WORKER_GROUPS) else out


def mode(instances: Iterable[Mapping[str, Any]]) -> str | None:
    """The router mode these (published) instances need: "aggregated" (smg regular mode), "pd",
    or None when there are none. A mix is an error (`mode_problems` words it)."""
    roles = {inst.get("role") for inst in instances}
    if not roles:
        return None
    if roles == {AGGREGATED}:
        return AGGREGATED
    if AGGREGATED in roles:
        raise TopologyError(" ".join(mode_problems({"": list(instances)})))
    return "pd"


def mode_problems(by_host: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """A deployment has one router mode: every instance aggregated, or none (each host's entries,
    published or raw, by host). The message names the hosts and entries on each side and the fix."""
    aggregated: list[str] = []
    pd: list[str] = []
    for host, entries in by_host.items():
        if not isinstance(entries, Sequence) or isinstance(entries, str):
            continue
        for entry, name in zip(entries, program_names(entries), strict=True):
            if not isinstance(entry, Mapping):
                continue
            where = f"{host}:pd:{name}" if host else f"pd:{name}"
            if entry.get("role") == AGGREGATED:
                aggregated.append(where)
            elif entry.get("role") in PD_ROLES:
                pd.append(where)
    if not aggregated or not pd:
        return []
    return [
        f"{VARIABLE} mixes aggregated instances ({', '.join(aggregated)}) with prefill/decode instances "
        f"({', '.join(pd)}): a host runs either PD instances or aggregated ones, and the router has one "
        f"mode (smg PD mode for prefill/decode, regular mode for aggregated). Set role: aggregated on "
        f"every entry of every worker host's {VARIABLE}, or on none."
    ]


def instances(
    raw: Any,
    roles: Iterable[str],
    host: str = "",
    advertise_host: str = "",
    reserved_ports: Mapping[str, Any] | None = None,
) -> list[Instance]:
    """The host's instances, checked; TopologyError listing every problem when any."""
    roles = list(roles)
    errors = problems(host or "this host", raw, roles, reserved_ports=reserved_ports)
    if errors:
        raise TopologyError(" ".join(errors))
    return [
        Instance(
            role=d["role"],
            name=d["name"],
            gpus=tuple(d["gpus"]),
            tp_size=int(d["tp_size"]),
            port=int(d["port"]),
            bootstrap_port=d["bootstrap_port"],
            env=d["env"],
            extra_args=tuple(d["extra_args"]),
            url=d["url"],
            host=host,
        )
        for d in published(raw, host, advertise_host, roles)
    ]


# ---- checking ------------------------------------------------------------------------------
@dataclass
class _Labels:
    """How messages name an entry's fields: serving_instances[i].port, or the per-role variable."""

    index: int
    name: str
    per_role: Mapping[str, str] | None = None

    def __call__(self, key: str) -> str:
        if self.per_role is not None and key in self.per_role:
            return self.per_role[key]
        return f"{VARIABLE}[{self.index}].{key}"

    @property
    def entry(self) -> str:
        if self.per_role is not None:
            return f"the {self.name} server"
        return f"{VARIABLE}[{self.index}] ({self.name})"


def problems(
    host: str,
    raw: Any,
    roles: Iterable[str],
    gpu_count: int | None = None,
    reserved_ports: Mapping[str, Any] | None = None,
    per_role: bool = False,
) -> list[str]:
    """Everything wrong with a host's instances, each message naming the variable and the fix.

    `roles` are the host's inventory groups; `gpu_count` the GPUs it has (None: not known);
    `reserved_ports` other ports the host opens (router), by variable. `per_role`: the list is the
    default built from the per-role variables, so messages name those (serving_decode_gpus, ...).
    """
    roles = [r for r in roles if r in (*WORKER_GROUPS, "router")]
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        return [
            f"{host}: {VARIABLE} must be a list of instances "
            f"({{role, gpus, tp_size, port[, bootstrap_port]}}), got {raw!r}."
        ]
    errors: list[str] = []
    names = program_names(raw)
    labels = [
        _Labels(i, names[i], PER_ROLE_VARIABLES.get(str(e.get("role"))) if isinstance(e, Mapping) else None)
        if per_role
        else _Labels(i, names[i])
        for i, e in enumerate(raw)
    ]
    gpu_sets: list[tuple[_Labels, list[int]]] = []
    ports: dict[int, list[str]] = defaultdict(list)
    for entry, label in zip(raw, labels, strict=True):
        if not isinstance(entry, Mapping):
            errors.append(
                f"{host}: {VARIABLE}[{label.index}] must be a dict with role, gpus, tp_size, port; "
                f"got {entry!r}."
            )
            continue
        errors += _entry_errors(host, entry, label, roles, gpu_count)
        gpus = _gpu_list(entry.get("gpus"))
        if gpus:
            gpu_sets.append((label, gpus))
        for key in ("port", "bootstrap_port"):
            port = _int(entry.get(key))
            if port is not None and 1 <= port <= 65535:
                ports[port].append(label(key))
    aggregated = any(isinstance(e, Mapping) and e.get("role") == AGGREGATED for e in raw)
    if aggregated:
        errors += [f"{host}: {message}" for message in mode_problems({"": raw})]
    for role in PD_ROLES:
        if aggregated:
            break  # an aggregated host: its worker groups only say that it runs SGLang
        if role in roles and not any(isinstance(e, Mapping) and e.get("role") == role for e in raw):
            errors.append(
                f"{host}: the host is in inventory group {role} but {VARIABLE} has no {role} instance: "
                f"add one (role: {role}), make every entry role: aggregated, or take the host out of "
                f"group {role}."
            )
    errors += _duplicate_name_errors(host, raw, names)
    errors += _overlap_errors(host, gpu_sets)
    for variable, value in (reserved_ports or {}).items():
        port = _int(value)
        if port is None or not 1 <= port <= 65535:
            errors.append(f"{host}: {variable} must be a TCP port (1-65535), got {value!r}.")
        elif variable not in ports[port]:
            ports[port].append(variable)
    for port, users in sorted(ports.items()):
        if len(users) > 1:
            errors.append(
                f"{host}: port {port} is used by {' and '.join(users)}; each server on a host needs its own "
                f"port. Change one of them in the inventory."
            )
    return errors


def _entry_errors(
    host: str, entry: Mapping[str, Any], label: _Labels, roles: Sequence[str], gpu_count: int | None
) -> list[str]:
    errors = []
    unknown = sorted(str(k) for k in entry if k not in ENTRY_KEYS)
    if unknown:
        errors.append(
            f"{host}: {label.entry} has unknown key(s) {unknown}; an instance takes {', '.join(ENTRY_KEYS)}."
        )
    role = entry.get("role")
    if role not in WORKER_ROLES:
        return [
            *errors,
            f"{host}: {VARIABLE}[{label.index}].role must be prefill, decode or aggregated, got {role!r}.",
        ]
    if role == AGGREGATED and not set(roles) & set(WORKER_GROUPS):
        errors.append(
            f"{host}: {label.entry} is an aggregated instance but the host is in neither inventory group "
            f"prefill nor decode (the worker groups every stage reads): add the host to one of them or "
            f"remove the instance."
        )
    elif role != AGGREGATED and role not in roles:
        errors.append(
            f"{host}: {label.entry} is a {role} instance but the host is not in inventory group {role} "
            f"(the router finds {role} instances by that group): add the host to group {role} or remove "
            f"the instance."
        )
    name = entry.get("name")
    if name is not None and not (isinstance(name, str) and _NAME.match(name) and name.split("-")[0] == role):
        errors.append(
            f"{host}: {label('name')}={name!r} is not a program name for an instance of role {role}: use "
            f"{role} or {role}-<letters, digits, _> (it becomes pd:<name>)."
        )
    errors += _gpu_errors(host, entry.get("gpus"), label, gpu_count)
    errors += _tp_errors(host, entry, label)
    port = _int(entry.get("port"))
    if port is None or not 1 <= port <= 65535:
        errors.append(f"{host}: {label('port')} must be a TCP port (1-65535), got {entry.get('port')!r}.")
    bootstrap = entry.get("bootstrap_port")
    if role == "prefill":
        value = _int(bootstrap)
        if value is None or not 1 <= value <= 65535:
            errors.append(
                f"{host}: {label('bootstrap_port')} must be a TCP port (1-65535), got {bootstrap!r}: every "
                f"prefill instance needs its own disaggregation bootstrap port (decode dials it for the KV)."
            )
    elif bootstrap not in (None, ""):
        errors.append(
            f"{host}: {label.entry} is a{'n' if role == AGGREGATED else ''} {role} instance with "
            f"bootstrap_port {bootstrap!r}; only prefill instances open one. Remove it."
        )
    if not isinstance(entry.get("env") or {}, Mapping):
        errors.append(f"{host}: {label('env')} must be a dict of NAME: value, got {entry.get('env')!r}.")
    extra = entry.get("extra_args") or []
    if not isinstance(extra, Sequence) or isinstance(extra, str):
        errors.append(f"{host}: {label('extra_args')} must be a list of flags, got {extra!r}.")
    return errors


def _gpu_errors(host: str, gpus: Any, label: _Labels, gpu_count: int | None) -> list[str]:
    variable = label("gpus")
    if not isinstance(gpus, Sequence) or isinstance(gpus, str) or not gpus:
        return [f"{host}: {variable} must be a non-empty list of GPU indices, got {gpus!r}."]
    values = list(gpus)
    if any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in values):
        return [f"{host}: {variable}={values} holds a value that is not a GPU index (0, 1, ...)."]
    errors = []
    duplicates = sorted({g for g in values if values.count(g) > 1})
    if duplicates:
        errors.append(f"{host}: {variable}={values} lists GPU {duplicates} more than once.")
    if gpu_count is not None:
        missing = sorted(g for g in values if g >= gpu_count)
        if missing:
            errors.append(
                f"{host}: {variable}={values} names GPU {missing}, but the host has {gpu_count} GPU(s) "
                f"(indices 0-{gpu_count - 1}). Fix {variable} in the inventory."
            )
    return errors


def _tp_errors(host: str, entry: Mapping[str, Any], label: _Labels) -> list[str]:
    tp_size = entry.get("tp_size")
    if tp_size is None and label.per_role is None:
        return []  # defaults to the number of GPUs
    variable = label("tp_size")
    value = _int(tp_size)
    if value is None or value < 1:
        return [f"{host}: {variable} must be a positive integer, got {tp_size!r}."]
    gpus = entry.get("gpus")
    if isinstance(gpus, Sequence) and not isinstance(gpus, str) and gpus and len(gpus) != value:
        gpus_variable = label("gpus")
        return [
            f"{host}: {variable}={value} but {gpus_variable} has {len(gpus)} GPU(s) {list(gpus)}: "
            f"TP size must equal the number of GPUs. Set {variable}: {len(gpus)} or give "
            f"{gpus_variable} {value} GPUs."
        ]
    return []


def _duplicate_name_errors(host: str, raw: Sequence[Any], names: Sequence[str]) -> list[str]:
    where: dict[str, list[int]] = defaultdict(list)
    for i, (entry, name) in enumerate(zip(raw, names, strict=True)):
        if isinstance(entry, Mapping):
            where[name].append(i)
    return [
        f"{host}: {VARIABLE} entries {indices} would all be the program pd:{name}: give each its own name "
        f"(or leave name out: several instances of a role are numbered {name.split('-')[0]}-0, -1, ...)."
        for name, indices in sorted(where.items())
        if len(indices) > 1
    ]


def _overlap_errors(host: str, gpu_sets: Sequence[tuple[_Labels, list[int]]]) -> list[str]:
    errors = []
    for i, (a_label, a) in enumerate(gpu_sets):
        for b_label, b in gpu_sets[i + 1 :]:
            shared = sorted(set(a) & set(b))
            if shared:
                errors.append(
                    f"{host}: {a_label('gpus')}={a} and {b_label('gpus')}={b} share GPU {shared}; instances "
                    f"on one host need disjoint GPU sets (the lab default is [0, 1, 2, 3] and [4, 5, 6, 7])."
                )
    return errors


# ---- memory fit ----------------------------------------------------------------------------
MIB = 2**20


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def mem_fraction(default: Any, *extra_args: Sequence[Any] | None) -> float:
    """The --mem-fraction-static in force: the last one in the extra args, else `default`."""
    value = default
    for args in extra_args:
        words = [str(w) for w in (args or [])]
        for i, word in enumerate(words):
            if word == "--mem-fraction-static" and i + 1 < len(words):
                value = words[i + 1]
            elif word.startswith("--mem-fraction-static="):
                value = word.split("=", 1)[1]
    return float(value)


def gpu_memory_by_index(gpu_memory: Any) -> Mapping[int, int] | int:
    """NVML-shaped facts ([{index, memory_total_mib}, ...]) -> {index: MiB}; a number stays a number."""
    if isinstance(gpu_memory, Sequence) and not isinstance(gpu_memory, str):
        return {int(g["index"]): int(g["memory_total_mib"]) for g in gpu_memory if g.get("memory_total_mib")}
    return int(gpu_memory)


def memory_fit_errors(
    instances: Sequence[Mapping[str, Any]],
    host: str,
    checkpoint_bytes: Any,
    checkpoint_source: str,
    gpu_memory: Any,
    gpu_memory_source: str,
    default_fraction: Any,
    role_extra_args: Mapping[str, Sequence[Any]] | None = None,
    fraction_source: str = "serving_mem_fraction_static",
) -> list[str]:
    """Refuse a TP size whose share of the weights cannot fit a GPU at the static memory fraction.

    Each of an instance's `tp_size` GPUs holds about 1/tp_size of the checkpoint's bytes (tensor
    parallelism shards every large weight); SGLang gives weights and KV cache together
    --mem-fraction-static of the GPU's memory, so a larger share never loads, and a share that
    just fits leaves no KV cache. `instances` are published dicts; `gpu_memory` NVML-shaped facts
    or one MiB figure for every GPU; the fraction is `default_fraction` unless the role's or the
    instance's extra args set --mem-fraction-static. The smallest GPU of an instance counts.
    """
    by_index = gpu_memory_by_index(gpu_memory)
    size = int(checkpoint_bytes)
    errors = []
    for inst in instances:
        tp_size = _int(inst.get("tp_size")) or 0
        gpus = _gpu_list(inst.get("gpus")) or []
        sizes = [by_index.get(g) for g in gpus] if isinstance(by_index, Mapping) else [by_index]
        sizes = [m for m in sizes if m]
        if not sizes or tp_size < 1 or size <= 0:
            continue
        role_args = (role_extra_args or {}).get(str(inst.get("role")), [])
        fraction = mem_fraction(default_fraction, role_args, inst.get("extra_args"))
        own = fraction != float(default_fraction)
        source = "--mem-fraction-static in its extra args" if own else f"{fraction_source}"
        total_mib = min(sizes)
        available = total_mib * MIB * fraction
        needed = size / tp_size
        if needed <= available:
            continue
        min_tp = math.ceil(size / available) if available > 0 else 0
        fix = f"give it at least {min_tp} GPUs (tp_size {min_tp})" if min_tp else "raise the memory fraction"
        errors.append(
            f"{host}: pd:{inst.get('name')} ({inst.get('role')}, tp_size {tp_size} on GPU(s) {gpus}) needs "
            f"{int(needed)} bytes ({_gib(needed)}) of weights per GPU (checkpoint {size} bytes from "
            f"{checkpoint_source} / tp_size {tp_size}), but a GPU offers {int(available)} bytes "
            f"({_gib(available)}): {fraction} ({source}) of its {total_mib} MiB ({gpu_memory_source}). "
            f"In serving_instances {fix}; a higher {fraction_source} helps only while the KV cache "
            f"keeps room beside the weights."
        )
    return errors
