"""Record what pynvml returns on a real GPU host, call by call, as JSON.

Run on the lent GPU by device_record.sh. The unit tests replay this record through a fake pynvml
(tests/gpu/fake_nvml.py), so CI parses exactly what NVML said on real hardware.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pynvml


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(call, *args):
    try:
        return {"value": call(*args)}
    except pynvml.NVMLError as err:
        return {"error": err.value}


def _bar1(handle):
    answer = _try(pynvml.nvmlDeviceGetBAR1MemoryInfo, handle)
    if "value" in answer:
        info = answer["value"]
        answer["value"] = {"bar1Total": info.bar1Total, "bar1Used": info.bar1Used, "bar1Free": info.bar1Free}
    return answer


def main() -> int:
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    devices = []
    for handle in handles:
        bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
        address = f"{int(bus_id.split(':')[0], 16):04x}:{bus_id.split(':', 1)[1].lower()}"
        sysdir = Path("/sys/bus/pci/devices") / address
        nvlink = [_try(pynvml.nvmlDeviceGetNvLinkState, handle, link) for link in range(4)]
        devices.append(
            {
                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "cuda_compute_capability": list(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
                "memory_total": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
                "bus_id": bus_id,
                "max_pcie_link_generation": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                "curr_pcie_link_generation": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                "curr_pcie_link_width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
                "max_pcie_link_width": pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
                "gpu_max_pcie_link_generation": _try(pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle),
                "bar1_memory_info": _bar1(handle),
                "persistence_mode": _try(pynvml.nvmlDeviceGetPersistenceMode, handle),
                "ecc_uncorrected_volatile": _try(
                    pynvml.nvmlDeviceGetTotalEccErrors,
                    handle,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    pynvml.NVML_VOLATILE_ECC,
                ),
                "nvlink_state_first_links": nvlink,
                "sysfs_numa_node": (sysdir / "numa_node").read_text().strip(),
                "sysfs_local_cpulist": (sysdir / "local_cpulist").read_text().strip(),
                "sysfs_device_id": (sysdir / "device").read_text().strip(),
                "sysfs_class": (sysdir / "class").read_text().strip(),
            }
        )
    record = {
        "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": pynvml.nvmlSystemGetCudaDriverVersion(),
        "nvml_version": _text(pynvml.nvmlSystemGetNVMLVersion()),
        "devices": devices,
    }
    pynvml.nvmlShutdown()
    json.dump(record, sys.stdout, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
