"""Which GPUs a program sees and which NUMA node it runs on.

CUDA_VISIBLE_DEVICES takes NVML indices (the facts' `index`); numactl binds CPUs and memory to the
node(s) those GPUs hang off, so host-side buffers (pinned KV staging, NCCL proxies) stay local.
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


def gpu_binding(
    gpus: Sequence[Any], facts: Sequence[Mapping[str, Any]], variable: str = "GPUs"
) -> dict[str, Any]:
    """CUDA_VISIBLE_DEVICES, NUMA nodes and the numactl prefix for one program."""
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
    numactl: list[str] = []
    if nodes and not unknown:
        node_list = ",".join(map(str, nodes))
        numactl = [f"--cpunodebind={node_list}", f"--membind={node_list}"]
    return {
        "cuda_visible_devices": ",".join(map(str, indices)),
        "numa_nodes": nodes,
        "numactl_args": numactl,
        "gpus_without_numa_node": unknown,
        "spans_numa_nodes": len(nodes) > 1,
        "simulated": any(bool(by_index[i].get("simulated")) for i in indices),
    }
