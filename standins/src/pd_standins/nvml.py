"""A pynvml-shaped module over the simulated GPUs: the NVML a rehearsal's product code reads.

The rehearsal has no GPU and no driver, so the GPU exporter (pd_appliance.monitoring.gpu_exporter,
`--nvml-module pd_standins.nvml`) and the GPU facts (the pd_nvml_facts module, `nvml_module`) load
this module instead of `pynvml`: their code is the same as on a lab host, only the library at the
boundary differs. `STAND_IN` names what stands in for NVML; the exporter puts it in the `stand_in`
label of every series and the facts in every GPU's `stand_in`.

Every function answers as nvidia-ml-py's pynvml.py of the same name does (13.615.71, the tools venv's:
the same arguments, the same return shapes: ints, bytes or str, ctypes-like structures with the
fields pynvml's structures have, NVMLError with `value` on an NVML error code), from the simulated
GPUs' declared data (pd_standins.gpus).

The GPUs are pd_standins.gpus.simulated_gpu(0..N-1), N from PD_SIM_GPUS (default 8, the lab
server's count); PD_SIM_P2P_STATUS, where set, is what NVML answers for every peer (a platform
without P2P: CHIPSET_NOT_SUPPORTED) instead of each GPU's declared "OK". They report an idle
board: no load, idle clocks, a few watts; nothing here is a measurement.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from pd_standins.gpus import simulated_gpu

# What stands in for the GPUs, as the exporter labels every series (stand_in) and says at start-up.
STAND_IN = "simulated GPUs (pd_standins.nvml, standins/declared.yml)"
DEFAULT_GPU_COUNT = 8
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
# nvmlClockType_t, as pynvml names it.
NVML_CLOCK_MEM = 2
# pynvml's constants of the same names (nvmlEnableState_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t).
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_NVLINK_MAX_LINKS = 36
# nvmlGpuTopologyLevel_t: GPUs on one NUMA node meet at its host bridges (NODE), else across sockets.
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
# nvmlGpuP2PStatus_t names, as pd_appliance.gpu.pcie reads them back.
P2P_STATUS_CODES = {
    "OK": 0,
    "CHIPSET_NOT_SUPPORTED": 1,
    "GPU_NOT_SUPPORTED": 2,
    "IOH_TOPOLOGY_NOT_SUPPORTED": 3,
    "DISABLED_BY_REGKEY": 4,
    "NOT_SUPPORTED": 5,
    "UNKNOWN": 6,
}
# The driver this stand-in answers as: the lab's pinned one (inventory/lab/group_vars/all/driver.yml),
# with the CUDA driver API it ships (13.0, as nvmlSystemGetCudaDriverVersion encodes it). No driver
# is here; these are declared answers, not readings.
DRIVER_VERSION = "580.159.04"
CUDA_DRIVER_VERSION = 13000
MIB = 1024 * 1024
_STARTED = time.monotonic()
_state = {"initialised": False}


class NVMLError(Exception):
    """pynvml's error class: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(f"simulated NVML error {value}")


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass(frozen=True)
class _Utilization:
    gpu: int
    memory: int


@dataclass(frozen=True)
class _Memory:
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class _Pci:
    busId: bytes  # pynvml's field name


@dataclass(frozen=True)
class _Bar1:
    bar1Total: int  # pynvml's c_nvmlBAR1Memory_t fields, bytes
    bar1Free: int
    bar1Used: int


def gpu_count() -> int:
    """How many simulated GPUs this host has (PD_SIM_GPUS)."""
    raw = os.environ.get("PD_SIM_GPUS", "")
    return int(raw) if raw.strip() else DEFAULT_GPU_COUNT


def _gpu(handle: _Handle) -> dict[str, Any]:
    if not _state["initialised"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    gpu = simulated_gpu(handle.index)
    p2p = os.environ.get("PD_SIM_P2P_STATUS", "").strip()
    return {**gpu, "p2p_status": p2p} if p2p else gpu


def nvmlInit() -> None:
    _state["initialised"] = True


def nvmlShutdown() -> None:
    _state["initialised"] = False


def nvmlSystemGetDriverVersion() -> str:
    return DRIVER_VERSION


def nvmlSystemGetCudaDriverVersion() -> int:
    return CUDA_DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    if not _state["initialised"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return gpu_count()


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return str(_gpu(handle)["uuid"])


def nvmlDeviceGetName(handle: _Handle) -> str:
    return str(_gpu(handle)["name"])


def nvmlDeviceGetCudaComputeCapability(handle: _Handle) -> tuple[int, int]:
    major, minor = str(_gpu(handle)["compute_capability"]).split(".")
    return int(major), int(minor)


def nvmlDeviceGetPciInfo(handle: _Handle) -> _Pci:
    return _Pci(busId=str(_gpu(handle)["pci_bus_id"]).encode())


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> _Utilization:
    _gpu(handle)
    return _Utilization(gpu=0, memory=0)


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> _Memory:
    total = int(_gpu(handle)["memory_total_mib"]) * MIB
    used = 512 * MIB  # what the driver's context takes on an idle board
    return _Memory(total=total, used=used, free=total - used)


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    _gpu(handle)
    return 30_000  # mW


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    _gpu(handle)
    return 600_000  # mW: the RTX PRO 6000 Blackwell's board limit


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    _gpu(handle)
    return int((time.monotonic() - _STARTED) * 30_000)  # mJ at 30 W


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    _gpu(handle)
    return 35


def nvmlDeviceGetClockInfo(handle: _Handle, clock: int) -> int:
    _gpu(handle)
    return {0: 180, 1: 180, 2: 405}.get(clock, 0)  # MHz, idle


def nvmlDeviceGetMemoryBusWidth(handle: _Handle) -> int:
    return int(_gpu(handle)["memory_bus_width_bits"])


def nvmlDeviceGetMaxClockInfo(handle: _Handle, clock: int) -> int:
    return int(_gpu(handle)["memory_clock_max_mhz"]) if clock == NVML_CLOCK_MEM else 0


def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
    gpu = _gpu(handle)
    return int(gpu.get("pcie_generation_current", gpu["pcie_generation"]))


def nvmlDeviceGetGpuMaxPcieLinkGeneration(handle: _Handle) -> int:
    gpu = _gpu(handle)
    return int(gpu.get("pcie_generation_gpu_max", gpu["pcie_generation"]))


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    return int(_gpu(handle)["pcie_generation"])


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    return int(_gpu(handle)["pcie_width"])


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    gpu = _gpu(handle)
    return int(gpu.get("pcie_width_max", gpu["pcie_width"]))


def nvmlDeviceGetPersistenceMode(handle: _Handle) -> int:
    return NVML_FEATURE_ENABLED if _gpu(handle)["persistence_mode"] else NVML_FEATURE_DISABLED


def nvmlDeviceGetBAR1MemoryInfo(handle: _Handle) -> _Bar1:
    total = int(_gpu(handle)["bar1_total_mib"]) * MIB
    return _Bar1(bar1Total=total, bar1Free=total, bar1Used=0)


def nvmlDeviceGetNumaNodeId(handle: _Handle) -> int:
    return int(_gpu(handle)["numa_node"])


def nvmlDeviceGetCpuAffinity(handle: _Handle, cpuSetSize: int) -> list[int]:
    """pynvml's answer: cpuSetSize 64-bit words, bit i of word w set for CPU 64 * w + i."""
    words = [0] * cpuSetSize
    first, last = (int(cpu) for cpu in str(_gpu(handle)["cpu_list"]).split("-"))
    for cpu in range(first, last + 1):
        if cpu // 64 < cpuSetSize:
            words[cpu // 64] |= 1 << (cpu % 64)
    return words


def nvmlDeviceGetTopologyCommonAncestor(device1: _Handle, device2: _Handle) -> int:
    same_node = _gpu(device1)["numa_node"] == _gpu(device2)["numa_node"]
    return NVML_TOPOLOGY_NODE if same_node else NVML_TOPOLOGY_SYSTEM


def nvmlDeviceGetP2PStatus(device1: _Handle, device2: _Handle, p2pIndex: int) -> int:
    """What each simulated GPU declares NVML answers for its peers (`p2p_status`), every capability."""
    _gpu(device2)
    return P2P_STATUS_CODES[str(_gpu(device1).get("p2p_status", "UNKNOWN"))]


def nvmlDeviceGetNvLinkState(device: _Handle, link: int) -> int:
    """The RTX PRO 6000 has no NVLink: NVML answers NOT_SUPPORTED, as on the lab's boards."""
    _gpu(device)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetPcieThroughput(handle: _Handle, counter: int) -> int:
    _gpu(handle)
    return 0


def nvmlDeviceGetPcieReplayCounter(handle: _Handle) -> int:
    _gpu(handle)
    return 0


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    return int(_gpu(handle)["ecc_errors_uncorrected"]) if error_type == 1 else 0


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    _gpu(handle)
    return 0x1  # GPU idle


def nvmlEventSetCreate() -> list[Any]:
    return []


def nvmlDeviceRegisterEvents(handle: _Handle, event_types: int, event_set: list[Any]) -> None:
    _gpu(handle)


def nvmlEventSetWait_v2(event_set: list[Any], timeout_ms: int) -> Any:
    """No simulated GPU raises an Xid: the wait always times out."""
    raise NVMLError(NVML_ERROR_TIMEOUT)
