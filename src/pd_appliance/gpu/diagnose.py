"""Turn an NVML failure into its root cause by looking at what the kernel says.

NVML reports symptoms ("Driver Not Loaded"); the cause is elsewhere: Secure Boot refusing an
unsigned module, nouveau holding the device, a DKMS build that never ran for this kernel, a GPU that
dropped off the bus. The probe reads sysfs and the kernel log so each case gets its own sentence.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pd_appliance.gpu import sysfs
from pd_appliance.gpu.errors import (
    DriverMismatchError,
    GpuFactsError,
    GpuLostError,
    ModuleLoadError,
    NoDriverError,
    NoGpuError,
    SecureBootUnsignedError,
)

NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

SECURE_BOOT_REJECTION = re.compile(
    r"Key was rejected by service|module verification failed|Lockdown: .*unsigned module|"
    r"Loading of unsigned module .* rejected",
    re.IGNORECASE,
)
DRIVER_LOG = re.compile(r"\bNVRM\b|\bnvidia\b|\bXid\b", re.IGNORECASE)
XID_FELL_OFF_BUS = re.compile(r"Xid .*\b79\b|fallen off the bus", re.IGNORECASE)
ROLE_HINT = "run the provision stage (ansible-playbook playbooks/provision.yml --tags driver)"


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def read_kernel_log() -> list[str]:
    """Kernel messages of this boot that mention the driver (journal first, then dmesg)."""
    text = _run(["journalctl", "-k", "-b", "-q", "--no-pager", "-n", "5000"]) or _run(["dmesg"]) or ""
    return [line for line in text.splitlines() if DRIVER_LOG.search(line)]


def modinfo_signer(module: str) -> str | None:
    """Signer of the module built for the running kernel: "" unsigned, None when there is no module."""
    text = _run(["modinfo", "-F", "signer", module])
    return None if text is None else text.strip()


@dataclass
class HostProbe:
    """Where the diagnoses look; tests replace each part."""

    sysfs_root: Path = Path("/sys")
    kernel_log: Callable[[], list[str]] = read_kernel_log
    module_signer: Callable[[str], str | None] = modinfo_signer
    kernel_release: str = field(default_factory=platform.release)


def _log_tail(lines: list[str], limit: int = 5) -> str:
    return " Kernel log: " + " | ".join(lines[-limit:]) if lines else ""


def diagnose_not_loaded(probe: HostProbe) -> GpuFactsError:
    """The kernel module is not loaded: find out why."""
    root = probe.sysfs_root
    if sysfs.module_loaded(root, "nouveau"):
        return ModuleLoadError(
            "nouveau is loaded and holds the GPUs, so nvidia cannot bind.",
            "blacklist nouveau, rebuild the initramfs and reboot: " + ROLE_HINT + ".",
        )
    log = probe.kernel_log()
    signer = probe.module_signer("nvidia")
    if sysfs.secure_boot_enabled(root) and (
        signer == "" or any(SECURE_BOOT_REJECTION.search(x) for x in log)
    ):
        return SecureBootUnsignedError(
            f"Secure Boot is enabled and the nvidia module for kernel {probe.kernel_release} is "
            f"{'unsigned' if signer == '' else 'signed by a key the kernel rejects'}.",
            "on Ubuntu use Canonical's signed modules (nvidia_driver_source: ubuntu-signed); "
            "otherwise enroll the DKMS signing key (mokutil --import /var/lib/dkms/mok.pub, reboot, "
            "confirm in MOK manager) and set nvidia_driver_secure_boot_mok_enrolled: true, "
            "or disable Secure Boot in the firmware."
            + _log_tail([x for x in log if SECURE_BOOT_REJECTION.search(x)]),
        )
    if signer is None:
        return ModuleLoadError(
            f"no nvidia kernel module exists for the running kernel {probe.kernel_release} "
            "(DKMS build missing or failed, or kernel headers absent).",
            f"check `dkms status` and /var/lib/dkms/nvidia/*/build/make.log, install "
            f"linux-headers-{probe.kernel_release}, then {ROLE_HINT}.",
        )
    return ModuleLoadError(
        "the nvidia kernel module exists but is not loaded." + _log_tail(log),
        "run `modprobe nvidia` and read the kernel log (journalctl -k -b | grep -i nvrm); " + ROLE_HINT + ".",
    )


def diagnose_nvml_error(code: int | None, message: str, probe: HostProbe) -> GpuFactsError:
    """Map an NVML error at init (or on a device) to its cause."""
    if not sysfs.nvidia_pci_gpus(probe.sysfs_root) and code in (
        NVML_ERROR_LIBRARY_NOT_FOUND,
        NVML_ERROR_DRIVER_NOT_LOADED,
    ):
        return NoGpuError(
            f"no NVIDIA GPU is on the PCI bus ({probe.sysfs_root}/bus/pci/devices) and NVML says: {message}.",
            "run this on a GPU host (check the inventory's prefill/decode groups); a machine without GPUs "
            "runs the rehearsal (`make rehearse`: the GPU is a declared stand-in there).",
        )
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return NoDriverError(
            "libnvidia-ml.so.1 was not found: no NVIDIA driver is installed.",
            ROLE_HINT + ".",
        )
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return diagnose_not_loaded(probe)
    if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        loaded = sysfs.loaded_module_version(probe.sysfs_root) or "unknown"
        return DriverMismatchError(
            f"the loaded kernel module is {loaded} but the user-space driver is another version "
            "(the driver was upgraded without a reboot).",
            "reboot the host (or set nvidia_driver_allow_reboot: true and re-run the driver stage).",
        )
    if code == NVML_ERROR_GPU_IS_LOST:
        return lost_gpu_error("NVML reports a GPU as lost.", probe)
    if code == NVML_ERROR_NO_PERMISSION:
        return GpuFactsError(
            f"NVML refused access ({message}).",
            "run the facts as root (become: true) or check /dev/nvidia* permissions.",
        )
    return GpuFactsError(f"NVML failed: {message} (code {code}).", "read `nvidia-smi -q` and the kernel log.")


def lost_gpu_error(detail: str, probe: HostProbe) -> GpuLostError:
    """A GPU fell off the bus: name what is missing and quote Xid 79 if the kernel logged it."""
    xid = [line for line in probe.kernel_log() if XID_FELL_OFF_BUS.search(line)]
    return GpuLostError(
        detail + _log_tail(xid),
        "power-cycle the host (a warm reboot rarely brings the GPU back); if it recurs, check the "
        "slot/riser, PSU and cooling, and the GPU's thermals in `nvidia-smi -q`.",
    )
