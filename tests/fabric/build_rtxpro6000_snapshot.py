"""Write fixtures/rtxpro6000-8gpu/healthy.json: the snapshot a healthy 8x RTX PRO 6000 host gives.

No such host is reachable from here, so this snapshot is composed, not recorded: its PCI part is
what the simulated-GPU stand-in declares for the lab's eight GPUs (pd_standins.gpus, formats as
the kernel and lspci print them; see its docstring), plus what a prepared lab host adds: an IOMMU
in passthrough (intel_iommu=on iommu=pt), pcie_aspm=off and HMM off for nvidia_uvm. The recorded
single-GPU snapshot of the lent H200 is fixtures/h200-2026-12-03/snapshot.json.

It also writes fixtures/rtxpro6000-8gpu/dual-socket-nvml.json: the NVML facts of the same host on
a dual-socket platform without P2P between the sockets (AMD Genoa: NVML answers
CHIPSET_NOT_SUPPORTED for every pair whose link is SYS), GPUs 0-3 on socket 0 and 4-7 on socket 1
as in healthy.json. Its PCI tree is healthy.json's (already two root complexes, one per NUMA node).
Run: python tests/fabric/build_rtxpro6000_snapshot.py
"""

from __future__ import annotations

import json
from pathlib import Path

from pd_appliance.gpu.diagnose import HostProbe
from pd_appliance.gpu.facts import gather_gpu_facts
from pd_standins import nvml as standin_nvml
from pd_standins.gpus import simulated_gpu, simulated_pci_snapshot

OUT = Path(__file__).parent / "fixtures" / "rtxpro6000-8gpu" / "healthy.json"
DUAL_SOCKET = OUT.parent / "dual-socket-nvml.json"
CROSS_SOCKET_P2P = "CHIPSET_NOT_SUPPORTED"


def dual_socket_nvml() -> dict[str, object]:
    """NVML facts (pd_gpus, pd_gpu_pcie) with P2P off across the two sockets."""
    facts = gather_gpu_facts(standin_nvml, HostProbe(sysfs_root=Path("/nonexistent-sysfs")))
    topo = facts["pd_gpu_pcie"]
    for key in ("p2p_read", "p2p_write", "p2p_atomics"):
        topo[key] = [
            [CROSS_SOCKET_P2P if topo["link"][i][j] == "SYS" else cell for j, cell in enumerate(row)]
            for i, row in enumerate(topo[key])
        ]
    return {
        "description": "8x RTX PRO 6000 on two sockets (GPUs 0-3 on NUMA node 0, 4-7 on node 1), no P2P "
        f"across sockets: NVML says {CROSS_SOCKET_P2P} for every SYS pair (composed, not recorded)",
        **facts,
    }


def main() -> None:
    snapshot = {"schema": 1, **simulated_pci_snapshot([simulated_gpu(i) for i in range(8)])}
    snapshot["sysfs"].update(
        {
            "class/iommu/dmar0": "",
            "class/iommu/dmar1": "",
            "module/pcie_aspm/parameters/policy": "[default] performance powersave powersupersave",
        }
    )
    snapshot["sysfs"] = dict(sorted(snapshot["sysfs"].items()))
    snapshot.update(
        {
            "cmdline": "BOOT_IMAGE=/vmlinuz-6.8.0-51-generic root=/dev/mapper/vg0-root ro "
            "intel_iommu=on iommu=pt pcie_aspm=off",
            "modprobe": {"/etc/modprobe.d/uvm.conf": "options nvidia_uvm uvm_disable_hmm=1"},
            "euid": 0,
        }
    )
    ordered = {
        k: snapshot[k]
        for k in ("schema", "sysfs", "links", "cmdline", "lspci", "lspci_error", "modprobe", "euid")
    }
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    DUAL_SOCKET.write_text(json.dumps(dual_socket_nvml(), indent=1) + "\n")


if __name__ == "__main__":
    main()
