"""The GPU-to-GPU PCIe matrices (the pd_gpu_pcie fact): link type (nvidia-smi topo vocabulary) and
P2P capability per pair. "pcie", not "topology": the serving topology is the SGLang instances
(pd_appliance.serving.topology, pd_serving_topology).

The serving role places a TP group on GPUs that share a switch or NUMA node; this matrix is what it
(and an operator reading the facts) checks that against.
"""

from __future__ import annotations

from typing import Any

# nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` prints them.
COMMON_ANCESTOR_NAMES = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_STATUS_NAMES = {
    0: "OK",
    1: "CHIPSET_NOT_SUPPORTED",
    2: "GPU_NOT_SUPPORTED",
    3: "IOH_TOPOLOGY_NOT_SUPPORTED",
    4: "DISABLED_BY_REGKEY",
    5: "NOT_SUPPORTED",
    6: "UNKNOWN",
}
P2P_CAPS = {"p2p_read": 0, "p2p_write": 1, "p2p_atomics": 3}
P2P_CAPS_NVLINK = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvlink_peers(nvml: Any, handle: Any) -> list[str]:
    """Remote PCI bus ids of the device's active NVLinks (empty where NVLink does not exist)."""
    peers = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
            peers.append(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower())
        except nvml.NVMLError as err:
            if getattr(err, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                break
            raise
    return peers


def _link_label(
    nvml: Any, handles: list[Any], bus_ids: list[str], peers: list[list[str]], i: int, j: int
) -> str:
    if i == j:
        return "X"
    direct = sum(1 for remote in peers[i] if remote == bus_ids[j])
    if direct:
        return f"NV{direct}"
    if peers[i] and _p2p(nvml, handles[i], handles[j], P2P_CAPS_NVLINK) == "OK":
        # Through an NVSwitch: every active link of the device reaches the peer.
        return f"NV{len(peers[i])}"
    level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
    return COMMON_ANCESTOR_NAMES.get(level, f"LEVEL{level}")


def _p2p(nvml: Any, first: Any, second: Any, cap: int) -> str:
    try:
        return P2P_STATUS_NAMES.get(int(nvml.nvmlDeviceGetP2PStatus(first, second, cap)), "UNKNOWN")
    except nvml.NVMLError as err:
        if getattr(err, "value", None) == NVML_ERROR_NOT_SUPPORTED:
            return "NOT_SUPPORTED"
        raise


def nvml_pcie_matrices(nvml: Any, handles: list[Any], bus_ids: list[str]) -> dict[str, Any]:
    """Link and P2P matrices over `handles` (NVML index order), as plain lists for JSON."""
    count = len(handles)
    normalized = [bus_id.lower() for bus_id in bus_ids]
    peers = [nvlink_peers(nvml, handle) for handle in handles]
    topology: dict[str, Any] = {
        "gpus": list(range(count)),
        "link": [
            [_link_label(nvml, handles, normalized, peers, i, j) for j in range(count)] for i in range(count)
        ],
    }
    for key, cap in P2P_CAPS.items():
        topology[key] = [
            ["X" if i == j else _p2p(nvml, handles[i], handles[j], cap) for j in range(count)]
            for i in range(count)
        ]
    return topology
