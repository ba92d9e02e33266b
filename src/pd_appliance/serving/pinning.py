"""Which GPUs a program sees and which NUMA node it runs on.

CUDA_VISIBLE_DEVICES takes NVML indices (the facts' `index`); numactl binds CPUs and memory to the
node(s) those GPUs hang off, so host-side buffers (pinned KV staging, NCCL proxies) stay local.

A GPU stand-in (the rehearsal's; its facts name it in `stand_in`) reports the lab's two NUMA nodes
whatever machine runs the rehearsal. Its binding is mapped onto the nodes that machine has
(`host_numa_online`, the kernel's /sys/devices/system/node/online), so the rendered numactl prefix
runs there too: on a one-node machine every stand-in GPU binds to node 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class PinningError(ValueError):
    """The GPU sets or the facts are inconsistent; the message names the variable to fix."""


def _indices(gpus: Iterable[Any], variable: str) -> list[int]:
    result = []
    for gpu in gpus:
        if isinstance(gpu, bool) or not str(gpu).lstrip().isdigit():
            raise PinningError(f"{variable} must list NVML GPU indices (integers), got {gpu!r}")
        result.append(int(gpu))
    if len(set(result)) != len(result):
        raise PinningError(f"{variable} lists a GPU twice: {result}")
    return result


def parse_node_list(text: str) -> list[int]:
    """Nodes of a kernel node list ("0", "0-1", "0,2-3"), as /sys/devices/system/node/online gives them."""
    nodes: list[int] = []
    for part in text.strip().split(","):
        if not part.strip():
            continue
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise PinningError(f"not a kernel node list: {text!r}")
        nodes.extend(range(int(first), int(last or first) + 1))
    return sorted(set(nodes))


def _host_nodes(reported_nodes: list[int], host_numa_online: str | None) -> list[int] | None:
    """The machine's nodes that a stand-in's `reported_nodes` bind to; None when the machine has no NUMA."""
    host = parse_node_list(host_numa_online or "")
    if not host:
        return None
    return sorted({n if n in host else host[n % len(host)] for n in reported_nodes})


def gpu_binding(
    gpus: Sequence[Any],
    facts: Sequence[Mapping[str, Any]],
    variable: str = "GPUs",
    host_numa_online: str | None = None,
) -> dict[str, Any]:
    """CUDA_VISIBLE_DEVICES, NUMA nodes and the numactl prefix for one program.

    `host_numa_online` is the machine's node list; only a GPU stand-in uses it (see the module doc).
    """
    indices = _indices(gpus, variable)
    by_index = {int(f["index"]): f for f in facts}
    missing = [i for i in indices if i not in by_index]
    if missing:
        known = sorted(by_index) or "none"
        raise PinningError(
            f"{variable} names GPU(s) {missing} that the NVML facts (pd_gpus) do not report "
            f"(this host has {known}): fix {variable} or the host"
        )
    nodes: list[int] = []
    unknown = []
    for i in indices:
        node = by_index[i].get("numa_node")
        if node is None or int(node) < 0:
            unknown.append(i)
        elif int(node) not in nodes:
            nodes.append(int(node))
    nodes.sort()
    stand_ins = sorted({str(by_index[i]["stand_in"]) for i in indices if by_index[i].get("stand_in")})
    stand_in = "; ".join(stand_ins) or None
    bind_nodes: list[int] | None = nodes
    if stand_in and nodes and not unknown:
        bind_nodes = _host_nodes(nodes, host_numa_online)
    numactl: list[str] = []
    if bind_nodes and not unknown:
        node_list = ",".join(map(str, bind_nodes))
        numactl = [f"--cpunodebind={node_list}", f"--membind={node_list}"]
    return {
        "cuda_visible_devices": ",".join(map(str, indices)),
        "numa_nodes": nodes,
        "numactl_args": numactl,
        "gpus_without_numa_node": unknown,
        "spans_numa_nodes": len(nodes) > 1,
        # What stands in for these GPUs (their facts' stand_in), None for GPUs NVML reads.
        "stand_in": stand_in,
        # The machine's nodes numactl binds to: the GPUs' own, or for a GPU stand-in the machine's
        # nodes its nodes map to ([] when the machine has no NUMA: then there is no prefix).
        "bind_numa_nodes": bind_nodes or [],
    }


def gpu_bindings(
    instances: Sequence[Mapping[str, Any]],
    facts: Sequence[Mapping[str, Any]] | None,
    host_numa_online: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Every instance's `gpu_binding` by program name, in one call (the role pins a host in one task).

    `host_numa_online` counts only where a GPU stand-in answers (see the module doc); "" is none.
    """
    facts = list(facts or [])
    online = (host_numa_online or None) if any(f.get("stand_in") for f in facts) else None
    return {
        str(inst["name"]): gpu_binding(
            inst["gpus"], facts, f"the GPUs of pd:{inst['name']} (serving_instances)", online
        )
        for inst in instances
    }
