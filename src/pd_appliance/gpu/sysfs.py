"""What the kernel knows without NVML: PCI devices, NUMA placement, module state, Secure Boot.

Every function takes the sysfs root so that tests (and the molecule scenario) point it at a tree of
their own; on a host it is /sys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NVIDIA_PCI_VENDOR = "0x10de"
# PCI class 0x0300xx (VGA) and 0x0302xx (3D controller): the GPU functions, not the audio function.
GPU_PCI_CLASSES = ("0x0300", "0x0302")
# Device ids from 0x2900 up are Blackwell (GB100 0x29xx, GB202 0x2bxx, ...) or newer: open modules only.
FIRST_OPEN_ONLY_DEVICE_ID = 0x2900
SECURE_BOOT_EFIVAR = "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA GPU function as sysfs lists it."""

    address: str  # sysfs form, e.g. "0000:18:00.0"
    device_id: int

    @property
    def needs_open_modules(self) -> bool:
        """Blackwell and later run only on the open kernel modules."""
        return self.device_id >= FIRST_OPEN_ONLY_DEVICE_ID


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def sysfs_pci_address(nvml_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as sysfs's "0000:18:00.0" (4-digit domain, lower case)."""
    domain, bus, devfn = nvml_bus_id.strip().lower().split(":", 2)
    return f"{int(domain, 16):04x}:{bus}:{devfn}"


def nvidia_pci_gpus(sysfs_root: Path) -> list[PciGpu]:
    """Every NVIDIA GPU function on the PCI bus, sorted by address."""
    devices = sysfs_root / "bus" / "pci" / "devices"
    found = []
    for dev in sorted(devices.glob("*")) if devices.is_dir() else []:
        if _read(dev / "vendor") != NVIDIA_PCI_VENDOR:
            continue
        pci_class = _read(dev / "class") or ""
        if not pci_class.startswith(GPU_PCI_CLASSES):
            continue
        device_id = _read(dev / "device") or "0x0"
        found.append(PciGpu(address=dev.name, device_id=int(device_id, 16)))
    return found


def pci_device_listed(sysfs_root: Path, pci_address: str) -> bool:
    """Whether sysfs lists the PCI device at all (the NUMA and CPU answers below are its, or absent)."""
    return (sysfs_root / "bus" / "pci" / "devices" / pci_address).exists()


def numa_node(sysfs_root: Path, pci_address: str) -> int | None:
    """The device's NUMA node; None when the firmware does not say (-1, a single-node host)."""
    value = _read(sysfs_root / "bus" / "pci" / "devices" / pci_address / "numa_node")
    if value is None or value.lstrip("-").isdigit() is False or int(value) < 0:
        return None
    return int(value)


def cpu_list(sysfs_root: Path, pci_address: str) -> str | None:
    """The CPUs local to the device, in kernel list form ("0-31,64-95")."""
    return _read(sysfs_root / "bus" / "pci" / "devices" / pci_address / "local_cpulist") or None


def loaded_module_version(sysfs_root: Path, module: str = "nvidia") -> str | None:
    """Version of the loaded kernel module, None if it is not loaded."""
    if not (sysfs_root / "module" / module).is_dir():
        return None
    return _read(sysfs_root / "module" / module / "version") or ""


def module_loaded(sysfs_root: Path, module: str) -> bool:
    """Whether a kernel module (nouveau, nvidia) is loaded."""
    return (sysfs_root / "module" / module).is_dir()


def secure_boot_enabled(sysfs_root: Path) -> bool:
    """Secure Boot state from the EFI variable (4 attribute bytes, then 1 = enabled)."""
    try:
        data = (sysfs_root / SECURE_BOOT_EFIVAR).read_bytes()
    except OSError:
        return False
    return len(data) >= 5 and data[4] == 1
