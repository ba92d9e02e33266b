"""Record the NVML answers the fabric checks read (BAR1, PCIe link, P2P per pair) on a real GPU host.

Run by tests/fabric/device_run.sh on the lent GPU; tests/fabric replays the record through
nvml_fabric_facts, so CI parses exactly what NVML said on real hardware.
"""

from __future__ import annotations

import json
import sys

import pynvml

P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "prop": 4}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(call, *args):
    try:
        value = call(*args)
    except pynvml.NVMLError as err:
        return {"error": err.value}
    return {"value": value}


def main() -> int:
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    devices = []
    for handle in handles:
        bar1 = pynvml.nvmlDeviceGetBAR1MemoryInfo(handle)
        devices.append(
            {
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "bus_id": _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                "memory_total": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
                "bar1_total": bar1.bar1Total,
                "bar1_used": bar1.bar1Used,
                "max_pcie_link_generation": _try(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                "gpu_max_pcie_link_generation": _try(pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle),
                "curr_pcie_link_generation": _try(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                "max_pcie_link_width": _try(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
                "curr_pcie_link_width": _try(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
            }
        )
    p2p = {}
    ancestor = {}
    for i, first in enumerate(handles):
        for j, second in enumerate(handles):
            for cap, index in P2P_CAPS.items():
                p2p[f"{i},{j},{cap}"] = _try(pynvml.nvmlDeviceGetP2PStatus, first, second, index)
            if i != j:
                ancestor[f"{i},{j}"] = _try(pynvml.nvmlDeviceGetTopologyCommonAncestor, first, second)
    record = {
        "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
        "nvml_version": _text(pynvml.nvmlSystemGetNVMLVersion()),
        "devices": devices,
        "p2p_status": p2p,
        "common_ancestor": ancestor,
    }
    pynvml.nvmlShutdown()
    json.dump(record, sys.stdout, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
