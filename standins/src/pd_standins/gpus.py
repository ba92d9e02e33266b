"""Simulated GPUs for rehearsal: what NVML would report for the lab's RTX PRO 6000s.

Every simulated value carries "simulated": True and a name that says so, so a report or a fact
built from them can never be mistaken for a measurement of real hardware.
"""

from __future__ import annotations

from typing import Any

SIMULATED_GPU_NAME = "Simulated NVIDIA RTX PRO 6000 Blackwell (rehearsal)"
GPUS_PER_NUMA_NODE = 4
CPUS_PER_NUMA_NODE = 32


def simulated_gpu(index: int) -> dict[str, Any]:
    """Return the NVML-shaped facts of simulated GPU `index` (8 per host, 4 per NUMA node)."""
    numa_node = int(index) // GPUS_PER_NUMA_NODE
    first_cpu = numa_node * CPUS_PER_NUMA_NODE
    return {
        "index": int(index),
        "uuid": f"GPU-5151ab00-0000-4000-8000-{int(index):012d}",
        "name": SIMULATED_GPU_NAME,
        "compute_capability": "12.0",
        "memory_total_mib": 97887,
        "pci_bus_id": f"00000000:{0x18 + 0x10 * int(index):02X}:00.0",
        "pcie_generation": 5,
        "pcie_width": 16,
        # A healthy lab host as the fabric checks read it: the link at its maximum, BAR1 (resizable
        # BAR on) covering the 96 GB of memory, NVML's P2P answer for every peer "OK".
        "pcie_generation_current": 5,
        "pcie_generation_gpu_max": 5,
        "pcie_width_max": 16,
        "bar1_total_mib": 131072,
        "p2p_status": "OK",
        "numa_node": numa_node,
        "cpu_list": f"{first_cpu}-{first_cpu + CPUS_PER_NUMA_NODE - 1}",
        "persistence_mode": True,
        "ecc_errors_uncorrected": 0,
        "simulated": True,
    }
