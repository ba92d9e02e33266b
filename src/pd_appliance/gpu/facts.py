"""Gather the pd_gpus / pd_gpu_* facts from NVML and sysfs.

The keys of each GPU dict are the contract in CONTRIBUTING.md ("Facts"); the serving role reads
numa_node and cpu_list from them for pinning. NVML is a pynvml-shaped module, `pynvml`
(nvidia-ml-py) unless the caller names another: where a declared stand-in answers in NVML's place
(standins/declared.yml), its module says what it is in `STAND_IN`, and every GPU carries that as
`stand_in`, so whatever shows the GPU names the stand-in in its own words.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from pd_appliance.gpu import sysfs
from pd_appliance.gpu.diagnose import (
    NVML_ERROR_GPU_IS_LOST,
    HostProbe,
    diagnose_nvml_error,
    lost_gpu_error,
)
from pd_appliance.gpu.errors import GpuFactsError
from pd_appliance.gpu.pcie import nvml_pcie_matrices

GPU_KEYS = (
    "index",
    "uuid",
    "name",
    "compute_capability",
    "memory_total_mib",
    "pci_bus_id",
    "pcie_generation",
    "pcie_width",
    "pcie_generation_current",
    "pcie_generation_gpu_max",
    "pcie_width_max",
    "bar1_total_mib",
    "numa_node",
    "cpu_list",
    "persistence_mode",
    "ecc_errors_uncorrected",
    "memory_bus_width_bits",
    "memory_clock_max_mhz",
    # What stands in for the GPU where a stand-in does (its own words), None for a GPU NVML reads.
    "stand_in",
)
NVML_ERROR_NOT_SUPPORTED = 3
# pynvml's NVML_CLOCK_MEM (nvmlClockType_t).
NVML_CLOCK_MEM = 2
MIB = 1024 * 1024
# pynvml's nvmlDeviceGetCpuAffinity answers in 64-bit words (c_ulonglong); 16 cover 1,024 CPUs.
CPU_AFFINITY_WORDS = 16


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load_nvml(module: str = "pynvml", path: str = "") -> Any:
    """Import the pynvml-shaped module (nvidia-ml-py's pynvml on a lab host), from `path` first where
    one is given (a module that is no part of the tools venv); its absence is a tools-venv problem,
    not a driver problem."""
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise GpuFactsError(
            f"the Python NVML bindings are missing ({err}).",
            f"install nvidia-ml-py into the interpreter that runs pd_nvml_facts (the appliance_tools role "
            f"does this for the tools venv), or name a module that exists (nvml_module {module!r}).",
        ) from err


def cpu_list_from_mask(words: Any) -> str | None:
    """nvmlDeviceGetCpuAffinity's 64-bit words as the kernel's list form ("0-31,64-95")."""
    cpus = [64 * w + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1]
    spans: list[list[int]] = []
    for cpu in cpus:
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or None


def _answer_or_none(nvml: Any, call: Any, *args: Any) -> Any:
    """A placement NVML may not give (a driver older than the call, a board without it): None on
    any NVML error, since sysfs is the placement's source and this only fills in where it is silent."""
    try:
        return call(*args)
    except nvml.NVMLError:
        return None


def _placement(nvml: Any, handle: Any, sysfs_root: Any, address: str) -> tuple[int | None, str | None]:
    """(numa_node, cpu_list) from sysfs, as the kernel sees the device. A device that sysfs does not
    list at all (a GPU NVML reports that this root's PCI tree does not hold) is placed by NVML's own
    answer (nvmlDeviceGetNumaNodeId, nvmlDeviceGetCpuAffinity), None where NVML has none either."""
    if sysfs.pci_device_listed(sysfs_root, address):
        return sysfs.numa_node(sysfs_root, address), sysfs.cpu_list(sysfs_root, address)
    node = _answer_or_none(nvml, nvml.nvmlDeviceGetNumaNodeId, handle)
    mask = _answer_or_none(nvml, nvml.nvmlDeviceGetCpuAffinity, handle, CPU_AFFINITY_WORDS)
    return (None if node is None or int(node) < 0 else int(node)), (
        None if mask is None else cpu_list_from_mask(mask)
    )


def cuda_version_string(encoded: int) -> str:
    """NVML's CUDA driver version (13000) as "13.0"."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def _optional(nvml: Any, call: Any, *args: Any) -> Any:
    """A query some boards do not implement (ECC on consumer parts): None instead of an error."""
    try:
        return call(*args)
    except nvml.NVMLError as err:
        if getattr(err, "value", None) == NVML_ERROR_NOT_SUPPORTED:
            return None
        raise


def gpu_entry(
    nvml: Any, handle: Any, index: int, sysfs_root: Any, stand_in: str | None = None
) -> dict[str, Any]:
    """One GPU's facts. PCIe generation is the link's maximum with this slot (the current one drops
    at idle, so pcie_generation_current is an idle reading); pcie_generation_gpu_max is what the GPU
    itself can do. The width is the current one, so a link trained down to x8 shows as 8 against
    pcie_width_max. bar1_total_mib is the framebuffer aperture peers map (the fabric checks)."""
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    address = sysfs.sysfs_pci_address(bus_id)
    persistence = _optional(nvml, nvml.nvmlDeviceGetPersistenceMode, handle)
    bar1 = _optional(nvml, nvml.nvmlDeviceGetBAR1MemoryInfo, handle)
    gpu_max_gen = _optional(nvml, nvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle)
    ecc = _optional(
        nvml,
        nvml.nvmlDeviceGetTotalEccErrors,
        handle,
        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nvml.NVML_VOLATILE_ECC,
    )
    # The memory bandwidth the decode roofline divides by (pd_appliance.bench.roofline).
    bus_width = _optional(nvml, nvml.nvmlDeviceGetMemoryBusWidth, handle)
    memory_clock = _optional(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, NVML_CLOCK_MEM)
    numa_node, cpus = _placement(nvml, handle, sysfs_root, address)
    return {
        "index": index,
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "compute_capability": f"{major}.{minor}",
        "memory_total_mib": int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
        "pci_bus_id": bus_id,
        "pcie_generation": int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        "pcie_width": int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        "pcie_generation_current": int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        "pcie_generation_gpu_max": None if gpu_max_gen is None else int(gpu_max_gen),
        "pcie_width_max": int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        "bar1_total_mib": None if bar1 is None else int(bar1.bar1Total) // MIB,
        "numa_node": numa_node,
        "cpu_list": cpus,
        "persistence_mode": None if persistence is None else bool(persistence == nvml.NVML_FEATURE_ENABLED),
        "ecc_errors_uncorrected": None if ecc is None else int(ecc),
        "memory_bus_width_bits": None if bus_width is None else int(bus_width),
        "memory_clock_max_mhz": None if memory_clock is None else int(memory_clock),
        "stand_in": stand_in,
    }


def _collect(nvml: Any, probe: HostProbe) -> dict[str, Any]:
    driver_version = _text(nvml.nvmlSystemGetDriverVersion())
    cuda_version = cuda_version_string(int(nvml.nvmlSystemGetCudaDriverVersion()))
    handles, gpus = [], []
    stand_in = getattr(nvml, "STAND_IN", None) or None
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(gpu_entry(nvml, handle, index, probe.sysfs_root, stand_in))
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == NVML_ERROR_GPU_IS_LOST:
                raise lost_gpu_error(f"NVML reports GPU {index} as lost.", probe) from err
            raise
        handles.append(handle)
    on_bus = {gpu.address for gpu in sysfs.nvidia_pci_gpus(probe.sysfs_root)}
    missing = sorted(on_bus - {sysfs.sysfs_pci_address(gpu["pci_bus_id"]) for gpu in gpus})
    if missing:
        raise lost_gpu_error(
            f"{len(on_bus)} NVIDIA GPUs are on the PCI bus but NVML sees {len(gpus)}; "
            f"missing: {', '.join(missing)}.",
            probe,
        )
    return {
        "pd_gpus": gpus,
        "pd_gpu_driver_version": driver_version,
        "pd_gpu_cuda_version": cuda_version,
        "pd_gpu_pcie": nvml_pcie_matrices(nvml, handles, [gpu["pci_bus_id"] for gpu in gpus]),
    }


def gather_gpu_facts(nvml: Any = None, probe: HostProbe | None = None) -> dict[str, Any]:
    """The facts from NVML, or a GpuFactsError that names the cause and the fix."""
    nvml = load_nvml() if nvml is None else nvml
    probe = probe or HostProbe()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise diagnose_nvml_error(getattr(err, "value", None), str(err), probe) from err
    try:
        return _collect(nvml, probe)
    except nvml.NVMLError as err:
        raise diagnose_nvml_error(getattr(err, "value", None), str(err), probe) from err
    finally:
        nvml.nvmlShutdown()
