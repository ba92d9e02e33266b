"""A stand-in for pynvml that replays calls recorded on a real GPU (fixtures/nvml_raw.json).

Only the functions pd_appliance.gpu calls exist; anything else raises AttributeError, so a new call
in the code fails the unit tests until the recorder learns it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


class NVMLError(Exception):
    """pynvml's error: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(f"NVML error {value}")


class _Obj:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def _answer(recorded: dict[str, Any]) -> Any:
    if "error" in recorded:
        raise NVMLError(recorded["error"])
    return recorded["value"]


class FakeNvml:
    """Replays a record; `init_error`/`lost` inject the failures a real host produces."""

    NVMLError = NVMLError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(
        self, record: dict[str, Any], init_error: int | None = None, lost: int | None = None
    ) -> None:
        self.record = record
        self.devices = record["devices"]
        self.init_error = init_error
        self.lost = lost
        self.ancestor: dict[tuple[int, int], int] = {}
        self.p2p: dict[tuple[int, int, int], int] = {}
        self.nvlink_remote: dict[int, list[str]] = {}
        self.shutdowns = 0

    @classmethod
    def recorded(cls, name: str = "nvml_raw.json", **kwargs: Any) -> FakeNvml:
        return cls(json.loads((FIXTURES / name).read_text()), **kwargs)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.record["driver_version"]

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.record["cuda_driver_version"]

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index == self.lost:
            raise NVMLError(15)
        return index

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.devices[h]["uuid"]

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.devices[h]["name"]

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return tuple(self.devices[h]["cuda_compute_capability"])

    def nvmlDeviceGetMemoryInfo(self, h: int) -> _Obj:
        return _Obj(total=self.devices[h]["memory_total"])

    def nvmlDeviceGetPciInfo(self, h: int) -> _Obj:
        return _Obj(busId=self.devices[h]["bus_id"].encode())

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self.devices[h]["max_pcie_link_generation"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self.devices[h]["curr_pcie_link_width"]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self.devices[h]["curr_pcie_link_generation"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self.devices[h]["max_pcie_link_width"]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: int) -> int:
        return _answer(self.devices[h]["gpu_max_pcie_link_generation"])

    def nvmlDeviceGetBAR1MemoryInfo(self, h: int) -> _Obj:
        return _Obj(**_answer(self.devices[h]["bar1_memory_info"]))

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return _answer(self.devices[h]["persistence_mode"])

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0), "facts report uncorrected volatile ECC errors"
        return _answer(self.devices[h]["ecc_uncorrected_volatile"])

    # Not in the H200 record (taken before the roofline needed them): NVML_ERROR_NOT_SUPPORTED, as a
    # board without the query answers, until a device session records them.
    def nvmlDeviceGetMemoryBusWidth(self, h: int) -> int:
        return _answer(self.devices[h].get("memory_bus_width", {"error": 3}))

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        assert clock == 2, "facts read the maximum memory clock (NVML_CLOCK_MEM)"
        return _answer(self.devices[h].get("max_memory_clock", {"error": 3}))

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        remotes = self.nvlink_remote.get(h)
        if remotes is None:
            return _answer(self.devices[h]["nvlink_state_first_links"][min(link, 3)])
        if link >= len(remotes):
            raise NVMLError(2)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> _Obj:
        return _Obj(busId=self.nvlink_remote[h][link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.ancestor[(min(a, b), max(a, b))]

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, cap: int) -> int:
        return self.p2p.get((a, b, cap), 0)


def write_sysfs(root: Path, devices: list[dict[str, Any]], vendor: str = "0x10de") -> None:
    """A sysfs tree with the recorded PCI attributes of each device."""
    for dev in devices:
        domain, rest = dev["bus_id"].split(":", 1)
        path = root / "bus" / "pci" / "devices" / f"{int(domain, 16):04x}:{rest.lower()}"
        path.mkdir(parents=True)
        (path / "vendor").write_text(vendor + "\n")
        (path / "class").write_text(dev["sysfs_class"] + "\n")
        (path / "device").write_text(dev["sysfs_device_id"] + "\n")
        (path / "numa_node").write_text(dev["sysfs_numa_node"] + "\n")
        (path / "local_cpulist").write_text(dev["sysfs_local_cpulist"] + "\n")
