"""GPU facts for the appliance: NVML (nvidia-ml-py) plus sysfs, and the diagnoses of a broken driver.

`gather_gpu_facts` is the one entry point; the `pd_nvml_facts` Ansible module and
`python -m pd_appliance.gpu` both call it.
"""

from __future__ import annotations

from pd_appliance.gpu.errors import (
    DriverMismatchError,
    GpuFactsError,
    GpuLostError,
    ModuleLoadError,
    NoDriverError,
    NoGpuError,
    SecureBootUnsignedError,
)
from pd_appliance.gpu.facts import gather_gpu_facts, load_nvml

__all__ = [
    "DriverMismatchError",
    "GpuFactsError",
    "GpuLostError",
    "ModuleLoadError",
    "NoDriverError",
    "NoGpuError",
    "SecureBootUnsignedError",
    "gather_gpu_facts",
    "load_nvml",
]
