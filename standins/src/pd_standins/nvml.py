"""A pynvml-shaped module over the simulated GPUs: the NVML a rehearsal's GPU exporter reads.

The rehearsal has no GPU and no driver, so the exporter (pd_appliance.monitoring.gpu_exporter) is
started with `--nvml-module pd_standins.nvml` instead of the default `pynvml`: the exporter's code
is the same as on a lab host, only the library at the boundary differs. `STAND_IN` names what stands
in for NVML; the exporter puts it in the `stand_in` label of every series.

The GPUs are pd_standins.gpus.simulated_gpu(0..N-1), N from PD_SIM_GPUS (default 8, the lab
server's count). They report an idle board: no load, idle clocks, a few watts; nothing here is a
measurement.
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


def gpu_count() -> int:
    """How many simulated GPUs this host has (PD_SIM_GPUS)."""
    raw = os.environ.get("PD_SIM_GPUS", "")
    return int(raw) if raw.strip() else DEFAULT_GPU_COUNT


def _gpu(handle: _Handle) -> dict[str, Any]:
    if not _state["initialised"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return simulated_gpu(handle.index)


def nvmlInit() -> None:
    _state["initialised"] = True


def nvmlShutdown() -> None:
    _state["initialised"] = False


def nvmlSystemGetDriverVersion() -> str:
    return "simulated"


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
    return int(_gpu(handle)["pcie_generation"])


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    return int(_gpu(handle)["pcie_generation"])


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    return int(_gpu(handle)["pcie_width"])


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    return int(_gpu(handle)["pcie_width"])


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
