"""The ways a GPU host fails before serving, each naming its cause and the fix.

A driver problem that surfaces only as "NVML: Driver Not Loaded" costs an afternoon; each class
here turns one root cause into a sentence an operator can act on.
"""

from __future__ import annotations


class GpuFactsError(Exception):
    """Base class: `cause` is a stable keyword (for tests and Ansible), `fix` the next step."""

    cause = "unknown"

    def __init__(self, detail: str, fix: str) -> None:
        self.detail = detail
        self.fix = fix
        super().__init__(f"{self.cause}: {detail} Fix: {fix}")

    def as_dict(self) -> dict[str, str]:
        """The error as module output: the cause keyword, what was seen and what to do."""
        return {"cause": self.cause, "detail": self.detail, "fix": self.fix}


class NoDriverError(GpuFactsError):
    """No NVIDIA user-space driver (libnvidia-ml.so.1) on the host."""

    cause = "no_driver"


class SecureBootUnsignedError(GpuFactsError):
    """Secure Boot is on and the nvidia module is unsigned or signed by a key the kernel lacks."""

    cause = "secure_boot_unsigned_module"


class ModuleLoadError(GpuFactsError):
    """The nvidia kernel module is installed but not loaded (build, conflict or load failure)."""

    cause = "module_not_loaded"


class DriverMismatchError(GpuFactsError):
    """User space and the loaded kernel module are different driver versions (upgrade without reboot)."""

    cause = "driver_version_mismatch"


class GpuLostError(GpuFactsError):
    """A GPU on the PCI bus is missing from NVML or answers "GPU is lost" (fell off the bus, Xid 79)."""

    cause = "gpu_fell_off_bus"


class NoGpuError(GpuFactsError):
    """No NVIDIA GPU on the PCI bus at all."""

    cause = "no_gpu"
