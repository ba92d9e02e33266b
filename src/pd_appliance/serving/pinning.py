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


def check_gpu_sets(
    prefill_gpus: Sequence[Any] | None,
    decode_gpus: Sequence[Any] | None,
    prefill_tp_size: int | None = None,
    decode_tp_size: int | None = None,
) -> list[str]:
    """Refuse overlapping prefill/decode GPU sets on one host and sets that do not match TP; return notes."""
    notes = []
    sets = {}
    for role, gpus, tp in (
        ("prefill", prefill_gpus, prefill_tp_size),
        ("decode", decode_gpus, decode_tp_size),
    ):
        if gpus is None:
            continue
        variable = f"serving_{role}_gpus"
        indices = _indices(gpus, variable)
        if not indices:
            raise PinningError(f"{variable} is empty: list the GPUs the {role} server runs on")
        if tp is not None and len(indices) != int(tp):
            raise PinningError(
                f"{variable} has {len(indices)} GPUs but serving_{role}_tp_size is {tp}: "
                f"make them agree (one GPU per tensor-parallel rank)"
            )
        sets[role] = indices
        notes.append(f"{role}: GPUs {','.join(map(str, indices))}")
    if "prefill" in sets and "decode" in sets:
        overlap = sorted(set(sets["prefill"]) & set(sets["decode"]))
        if overlap:
            raise PinningError(
                f"serving_prefill_gpus and serving_decode_gpus share GPU(s) {overlap} on this host: "
                f"give each role its own GPUs"
            )
    return notes


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
