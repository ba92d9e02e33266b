"""Simulated GPUs for rehearsal: what NVML would report for the lab's RTX PRO 6000s, and the PCI
fabric a healthy lab host shows before any driver (the preflight fabric checks read it).

Every simulated value carries "simulated": True and a name that says so, so a report or a fact
built from them can never be mistaken for a measurement of real hardware. The PCI snapshot is
composed, not recorded: each value has the form the kernel (sysfs) and `lspci -vvv -D` (pciutils'
wording: "ACSCtl:", "LnkCtl: ASPM Disabled;", "Physical Resizable BAR") print, for a two-socket
server with two PCIe Gen5 switches (Broadcom PEX890xx) per socket and two GPUs behind each.
"""

from __future__ import annotations

from typing import Any

SIMULATED_GPU_NAME = "Simulated NVIDIA RTX PRO 6000 Blackwell (rehearsal)"
# What stands in for each GPU, as the product names it wherever the GPU shows (the GPU fact
# `stand_in`: STAND-IN (...) lines, the pinning notes, the validation report).
STAND_IN = "simulated GPU (pd_standins.gpus, standins/declared.yml)"
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
        # 512-bit GDDR7 at 28 Gb/s, NVIDIA's datasheet figure of 1,792 GB/s, as NVML's bus width
        # and double-data-rate clock (2 x 14,000 MHz x 64 bytes). Not read off a real board here.
        "memory_bus_width_bits": 512,
        "memory_clock_max_mhz": 14000,
        "simulated": True,
        "stand_in": STAND_IN,
    }


GPU_DESC = "3D controller: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition] (rev a1)"
SWITCH_DESC = "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])"
ROOT_DESC = "PCI bridge: Intel Corporation Device 352a (rev 04) (prog-if 00 [Normal decode])"
ACS_OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
ACS_CAP = "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


def _bridge_block(address: str, desc: str, port: str, secondary: int, numa: int) -> str:
    bus = int(address.split(":")[1], 16)
    return f"""{address} {desc}
\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr+ Stepping- SERR+ FastB2B- DisINTx+
\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- <PERR- INTx-
\tLatency: 0, Cache Line Size: 64 bytes
\tInterrupt: pin A routed to IRQ 0
\tNUMA node: {numa}
\tBus: primary={bus:02x}, secondary={secondary:02x}, subordinate={secondary + 1:02x}, sec-latency=0
\tCapabilities: [40] Express (v2) {port}, MSI 00
\t\tDevCap:\tMaxPayload 512 bytes, PhantFunc 0
\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM L1, Exit Latency L1 <8us
\t\t\tClockPM- Surprise+ LLActRep+ BwNot+ ASPMOptComp+
\t\tLnkCtl:\tASPM Disabled; RCB 64 bytes, Disabled- CommClk+
\t\t\tExtSynch- ClockPM- AutWidDis- BWInt- AutBWInt-
\t\tLnkSta:\tSpeed 32GT/s, Width x16
\t\t\tTrErr- Train- SlotClk+ DLActive+ BWMgmt+ ABWMgmt-
\tCapabilities: [220 v1] Access Control Services
\t\tACSCap:\t{ACS_CAP}
\t\tACSCtl:\t{ACS_OFF}
\tKernel driver in use: pcieport
"""


def _gpu_block(address: str, numa: int, group: int) -> str:
    return f"""{address} {GPU_DESC}
\tSubsystem: NVIDIA Corporation Device 204e
\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr+ Stepping- SERR+ FastB2B- DisINTx+
\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- <PERR- INTx-
\tLatency: 0
\tInterrupt: pin A routed to IRQ 16
\tNUMA node: {numa}
\tIOMMU group: {group}
\tRegion 0: Memory at d8000000 (32-bit, non-prefetchable) [size=64M]
\tRegion 1: Memory at 20000000000 (64-bit, prefetchable) [size=128G]
\tRegion 3: Memory at 22000000000 (64-bit, prefetchable) [size=32M]
\tCapabilities: [60] Power Management version 3
\tCapabilities: [68] Express (v2) Endpoint, MSI 00
\t\tDevCap:\tMaxPayload 256 bytes, PhantFunc 0, Latency L0s unlimited, L1 <64us
\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported
\t\t\tClockPM+ Surprise- LLActRep- BwNot- ASPMOptComp+
\t\tLnkCtl:\tASPM Disabled; RCB 64 bytes, Disabled- CommClk+
\t\t\tExtSynch- ClockPM- AutWidDis- BWInt- AutBWInt-
\t\tLnkSta:\tSpeed 32GT/s, Width x16
\t\t\tTrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-
\tCapabilities: [bb0 v1] Physical Resizable BAR
\t\tBAR 0: current size: 64MB, supported: 64MB
\t\tBAR 1: current size: 128GB, supported: 64MB 128MB 256MB 512MB 1GB 2GB 4GB 8GB 16GB 32GB 64GB 128GB
\t\tBAR 3: current size: 32MB, supported: 32MB
\tKernel driver in use: nvidia
\tKernel modules: nvidia
"""


def _resource(index: int) -> str:
    """sysfs `resource`: BAR0 64 MiB, BAR1 128 GiB (resizable BAR on), BAR3 32 MiB."""
    base = 0x20000000000 + index * 0x4000000000
    bar0, bar3 = 0xD8000000 + index * 0x4000000, base + 0x2000000000
    empty = "0x0000000000000000 0x0000000000000000 0x0000000000000000"
    return "\n".join(
        [
            f"0x{bar0:016x} 0x{bar0 + 0x3FFFFFF:016x} 0x0000000000040200",
            f"0x{base:016x} 0x{base + 128 * 2**30 - 1:016x} 0x000000000014220c",
            empty,
            f"0x{bar3:016x} 0x{bar3 + 32 * 2**20 - 1:016x} 0x000000000014220c",
            empty,
            empty,
            empty,
        ]
    )


def simulated_pci_snapshot(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The PCI part of a fabric snapshot (pd_appliance.fabric.collect) for these simulated GPUs.

    Healthy as a lab host should be: GPUs in identity-mapped IOMMU groups, ACS redirect off, ASPM
    disabled, BAR1 128 GiB. Each pair of GPUs (in index order) sits behind one switch whose
    upstream port hangs off a root port three bus numbers below the first GPU's.
    """
    sysfs: dict[str, str] = {}
    links: dict[str, str] = {}
    lspci: list[str] = []
    ordered = sorted(gpus, key=lambda g: int(g["index"]))
    for first in range(0, len(ordered), 2):
        pair = ordered[first : first + 2]
        numa = int(pair[0].get("numa_node") or 0)
        root = int(pair[0]["pci_bus_id"].split(":")[1], 16) - 3
        rp, up = f"0000:{root:02x}:01.0", f"0000:{root + 1:02x}:00.0"
        chain = f"../../../devices/pci0000:{root:02x}/{rp}/{up}"
        links[f"bus/pci/devices/{rp}"] = f"../../../devices/pci0000:{root:02x}/{rp}"
        links[f"bus/pci/devices/{up}"] = chain
        lspci.append(_bridge_block(rp, ROOT_DESC, "Root Port (Slot+)", root + 1, numa))
        lspci.append(_bridge_block(up, SWITCH_DESC, "Upstream Port", root + 2, numa))
        for slot, gpu in enumerate(pair):
            index = int(gpu["index"])
            bus = int(gpu["pci_bus_id"].split(":")[1], 16)
            down, address = f"0000:{root + 2:02x}:{slot:02x}.0", f"0000:{bus:02x}:00.0"
            group = 30 + index
            links[f"bus/pci/devices/{down}"] = f"{chain}/{down}"
            links[f"bus/pci/devices/{address}"] = f"{chain}/{down}/{address}"
            links[f"bus/pci/devices/{address}/iommu_group"] = f"../../../../kernel/iommu_groups/{group}"
            lspci.append(_bridge_block(down, SWITCH_DESC, "Downstream Port (Slot+)", bus, numa))
            lspci.append(_gpu_block(address, numa, group))
            gpu_files = {
                "vendor": "0x10de",
                "device": "0x2bb5",
                "class": "0x030200",
                "numa_node": str(numa),
                "current_link_speed": "32.0 GT/s PCIe",
                "current_link_width": "16",
                "max_link_speed": "32.0 GT/s PCIe",
                "max_link_width": "16",
                "resource": _resource(index),
            }
            sysfs.update({f"bus/pci/devices/{address}/{k}": v for k, v in gpu_files.items()})
            sysfs[f"kernel/iommu_groups/{group}/type"] = "identity"
            for bridge in (rp, up, down):
                sysfs[f"bus/pci/devices/{bridge}/vendor"] = "0x8086" if bridge == rp else "0x1000"
                sysfs[f"bus/pci/devices/{bridge}/class"] = "0x060400"
    return {
        "sysfs": dict(sorted(sysfs.items())),
        "links": dict(sorted(links.items())),
        "lspci": "\n".join(sorted(lspci)),
        "lspci_error": None,
    }
