"""Write fixtures/rtxpro6000-8gpu/healthy.json: the snapshot a healthy 8x RTX PRO 6000 host gives.

No such host is reachable from here, so this snapshot is composed, not recorded: every value has
the form the kernel (sysfs `resource`, link speed, IOMMU group type files) and `lspci -vvv -D`
(pciutils' ls-caps.c / ls-ecaps.c wording: "ACSCtl:", "LnkCtl: ASPM Disabled;", "Physical
Resizable BAR") print, and the layout of a two-socket server: per socket two PCIe Gen5 switches
(Broadcom PEX890xx) with two GPUs each, GPUs 0-3 on NUMA node 0 (prefill), 4-7 on node 1 (decode),
at the bus numbers the simulated-GPU stand-in uses. The recorded single-GPU snapshot of the lent
H200 is fixtures/h200-2026-12-03/snapshot.json. Run: python tests/fabric/build_rtxpro6000_snapshot.py
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).parent / "fixtures" / "rtxpro6000-8gpu" / "healthy.json"
GPU_DESC = "3D controller: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition] (rev a1)"
SWITCH_DESC = "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])"
ROOT_DESC = "PCI bridge: Intel Corporation Device 352a (rev 04) (prog-if 00 [Normal decode])"
ACS_OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
ACS_CAP = "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


def bridge_block(address: str, desc: str, port: str, secondary: int, numa: int) -> str:
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


def gpu_block(address: str, numa: int, group: int) -> str:
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


def main() -> None:
    sysfs: dict[str, str] = {}
    links: dict[str, str] = {}
    lspci: list[str] = []
    index = 0
    for socket_, roots in ((0, (0x15, 0x35)), (1, (0x55, 0x75))):
        for root in roots:
            rp, up = f"0000:{root:02x}:01.0", f"0000:{root + 1:02x}:00.0"
            chain = f"../../../devices/pci0000:{root:02x}/{rp}/{up}"
            for dev, (addr, desc, port, sec) in {
                rp: (rp, ROOT_DESC, "Root Port (Slot+)", root + 1),
                up: (up, SWITCH_DESC, "Upstream Port", root + 2),
            }.items():
                links[f"bus/pci/devices/{dev}"] = f"../../../devices/pci0000:{root:02x}/{rp}" + (
                    f"/{up}" if dev == up else ""
                )
                lspci.append(bridge_block(addr, desc, port, sec, socket_))
            for slot in range(2):
                down = f"0000:{root + 2:02x}:{slot:02x}.0"
                gpu = f"0000:{0x18 + 0x10 * index:02x}:00.0"
                links[f"bus/pci/devices/{down}"] = f"{chain}/{down}"
                links[f"bus/pci/devices/{gpu}"] = f"{chain}/{down}/{gpu}"
                links[f"bus/pci/devices/{gpu}/iommu_group"] = f"../../../../kernel/iommu_groups/{30 + index}"
                lspci.append(
                    bridge_block(down, SWITCH_DESC, "Downstream Port (Slot+)", 0x18 + 0x10 * index, socket_)
                )
                lspci.append(gpu_block(gpu, socket_, 30 + index))
                base = 0x20000000000 + index * 0x4000000000
                bar0, bar3 = 0xD8000000 + index * 0x4000000, base + 0x2000000000
                sysfs.update(
                    {
                        f"bus/pci/devices/{gpu}/vendor": "0x10de",
                        f"bus/pci/devices/{gpu}/device": "0x2bb5",
                        f"bus/pci/devices/{gpu}/class": "0x030200",
                        f"bus/pci/devices/{gpu}/numa_node": str(socket_),
                        f"bus/pci/devices/{gpu}/current_link_speed": "32.0 GT/s PCIe",
                        f"bus/pci/devices/{gpu}/current_link_width": "16",
                        f"bus/pci/devices/{gpu}/max_link_speed": "32.0 GT/s PCIe",
                        f"bus/pci/devices/{gpu}/max_link_width": "16",
                        f"bus/pci/devices/{gpu}/resource": "\n".join(
                            [
                                f"0x{bar0:016x} 0x{bar0 + 0x3FFFFFF:016x} 0x0000000000040200",
                                f"0x{base:016x} 0x{base + 128 * 2**30 - 1:016x} 0x000000000014220c",
                                "0x0000000000000000 0x0000000000000000 0x0000000000000000",
                                f"0x{bar3:016x} 0x{bar3 + 32 * 2**20 - 1:016x} 0x000000000014220c",
                                "0x0000000000000000 0x0000000000000000 0x0000000000000000",
                                "0x0000000000000000 0x0000000000000000 0x0000000000000000",
                                "0x0000000000000000 0x0000000000000000 0x0000000000000000",
                            ]
                        ),
                        f"kernel/iommu_groups/{30 + index}/type": "identity",
                    }
                )
                for bridge in (rp, up, down):
                    for attr, value in (
                        ("vendor", "0x8086" if bridge == rp else "0x1000"),
                        ("class", "0x060400"),
                    ):
                        sysfs[f"bus/pci/devices/{bridge}/{attr}"] = value
                index += 1
    sysfs["class/iommu/dmar0"] = ""
    sysfs["class/iommu/dmar1"] = ""
    sysfs["module/pcie_aspm/parameters/policy"] = "[default] performance powersave powersupersave"
    snapshot = {
        "schema": 1,
        "sysfs": dict(sorted(sysfs.items())),
        "links": dict(sorted(links.items())),
        "cmdline": "BOOT_IMAGE=/vmlinuz-6.8.0-51-generic root=/dev/mapper/vg0-root ro "
        "intel_iommu=on iommu=pt pcie_aspm=off",
        "lspci": "\n".join(sorted(lspci)),
        "lspci_error": None,
        "modprobe": {"/etc/modprobe.d/uvm.conf": "options nvidia_uvm uvm_disable_hmm=1"},
        "euid": 0,
    }
    OUT.write_text(json.dumps(snapshot, indent=1) + "\n")


if __name__ == "__main__":
    main()
