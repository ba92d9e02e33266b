"""Read a snapshot's PCI facts: the tree above each GPU (sysfs) and the capabilities `lspci -vvv` decodes.

The PCI tree comes from the sysfs device links (`bus/pci/devices/X -> ../../../devices/
pci0000:15/0000:15:01.0/.../X`): the bridges a GPU sits behind, nearest first, and its root
complex. ACS control, ASPM control, link status and resizable BAR sizes come from lspci's own
decoding of the configuration space (pciutils' ls-caps.c and ls-ecaps.c print them as parsed here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HEADER = re.compile(r"^(?P<bdf>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (?P<what>.*)$")
_ACS_CTL = re.compile(r"^\s*ACSCtl:\s*(?P<flags>.*)$")
_LNK_CTL = re.compile(r"^\s*LnkCtl:\s*ASPM (?P<aspm>[^;]+);")
_LNK_STA = re.compile(r"^\s*LnkSta:\s*Speed (?P<speed>[\d.]+)GT/s[^,]*, Width x(?P<width>\d+)")
_LNK_CAP = re.compile(r"^\s*LnkCap:\s*Port #\d+, Speed (?P<speed>[\d.]+)GT/s, Width x(?P<width>\d+)")
_REGION = re.compile(r"^\s*Region (?P<bar>\d+): .*\[size=(?P<size>\d+)(?P<unit>[KMGT]?)\]")
_REBAR = re.compile(
    r"^\s*BAR (?P<bar>\d+): current size: (?P<size>\d+)(?P<unit>[KMGT])B, supported: (?P<supported>.*)$"
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# PCIe transfer rate (GT/s) -> generation.
GT_S_TO_GENERATION = {"2.5": 1, "5": 2, "8": 3, "16": 4, "32": 5, "64": 6}
# ACS control bits that send peer-to-peer requests or completions up to the root complex.
ACS_REDIRECT_FLAGS = ("ReqRedir", "CmpltRedir", "EgressCtrl")


def mib(size_bytes: int) -> int:
    return size_bytes // 2**20


def _bytes(size: str, unit: str) -> int:
    return int(size) * _UNITS[unit]


@dataclass
class LspciDevice:
    """What lspci -vvv decoded for one function."""

    address: str
    description: str
    access_denied: bool = False
    acs_ctl: dict[str, bool] | None = None
    aspm: str | None = None  # "Disabled", "L1 Enabled", "L0s L1 Enabled", ...
    link_speed_gt_s: str | None = None
    link_width: int | None = None
    link_cap_speed_gt_s: str | None = None
    link_cap_width: int | None = None
    regions: dict[int, int] = field(default_factory=dict)  # BAR index -> bytes
    rebar: dict[int, tuple[int, int]] = field(default_factory=dict)  # BAR -> (current, largest supported)


def _largest(supported: str) -> int:
    sizes = [_bytes(m.group(1), m.group(2)) for m in re.finditer(r"(\d+)([KMGT])B", supported)]
    return max(sizes, default=0)


def parse_lspci(text: str | None) -> dict[str, LspciDevice]:
    """`lspci -vvv -D` output, one LspciDevice per function, by address."""
    devices: dict[str, LspciDevice] = {}
    current: LspciDevice | None = None
    for line in (text or "").splitlines():
        header = _HEADER.match(line)
        if header:
            current = LspciDevice(header.group("bdf"), header.group("what"))
            devices[current.address] = current
            continue
        if current is None:
            continue
        if "<access denied>" in line:
            current.access_denied = True
        if m := _ACS_CTL.match(line):
            current.acs_ctl = {
                flag[:-1]: flag.endswith("+") for flag in m.group("flags").split() if flag[-1:] in "+-"
            }
        elif m := _LNK_CTL.match(line):
            current.aspm = m.group("aspm").strip()
        elif m := _LNK_STA.match(line):
            current.link_speed_gt_s, current.link_width = m.group("speed"), int(m.group("width"))
        elif m := _LNK_CAP.match(line):
            current.link_cap_speed_gt_s, current.link_cap_width = m.group("speed"), int(m.group("width"))
        elif m := _REGION.match(line):
            current.regions[int(m.group("bar"))] = _bytes(m.group("size"), m.group("unit"))
        elif m := _REBAR.match(line):
            current.rebar[int(m.group("bar"))] = (
                _bytes(m.group("size"), m.group("unit")),
                _largest(m.group("supported")),
            )
    return devices


@dataclass
class PciGpu:
    """An NVIDIA GPU function in the snapshot, with what the fabric checks need about it."""

    index: int  # NVML's index: GPUs sorted by PCI address
    address: str
    numa_node: int | None
    bridges: list[str]  # nearest first, up to the root port
    root: str  # "pci0000:15": the host bridge (root complex) above it
    iommu_group: str | None
    bar1_bytes: int | None


def framebuffer_bar(resource: str | None) -> int | None:
    """Size of the GPU's framebuffer aperture (NVIDIA's "BAR1") from its sysfs `resource` file.

    The file has one "start end flags" line per resource; lines 0-5 are the BARs. The aperture is
    the largest of them, whatever its index: region 1 on a bare-metal RTX PRO 6000, region 2 where
    a 64-bit BAR0 takes two slots (the lent H200's VM: 16 MiB, -, 256 GiB, -, 32 MiB).
    """
    if not resource:
        return None
    sizes = []
    for line in resource.splitlines()[:6]:
        start, end, _flags = (int(x, 16) for x in line.split())
        sizes.append(end - start + 1 if end > start else 0)
    return max(sizes, default=0) or None


def gpus(snapshot: dict[str, Any]) -> list[PciGpu]:
    """The NVIDIA GPUs of a snapshot, NVML-indexed (sorted by address, as NVML enumerates them)."""
    files: dict[str, str] = snapshot.get("sysfs", {})
    links: dict[str, str] = snapshot.get("links", {})
    found = []
    addresses = sorted(
        rel.split("/")[3]
        for rel in links
        if rel.count("/") == 3
        and files.get(f"{rel}/vendor") == NVIDIA_VENDOR
        and files.get(f"{rel}/class", "").startswith(GPU_CLASS_PREFIXES)
    )
    for index, address in enumerate(addresses):
        rel = f"bus/pci/devices/{address}"
        parts = links[rel].split("/")
        chain = [p for p in parts if _BDF.match(p)]
        root = next((p for p in parts if p.startswith("pci")), "?")
        group = links.get(f"{rel}/iommu_group")
        node = files.get(f"{rel}/numa_node")
        found.append(
            PciGpu(
                index=index,
                address=address,
                numa_node=int(node) if node and node.lstrip("-").isdigit() and int(node) >= 0 else None,
                bridges=list(reversed(chain[:-1])),
                root=root,
                iommu_group=group.rsplit("/", 1)[-1] if group else None,
                bar1_bytes=framebuffer_bar(files.get(f"{rel}/resource")),
            )
        )
    return found


def path_bridges(first: PciGpu, second: PciGpu) -> list[str]:
    """Bridges a transfer between two GPUs crosses, nearest the first GPU first.

    Each GPU's bridges up to (not including) the lowest bridge they share: two GPUs behind one
    switch meet at its upstream port without crossing it. GPUs under different root complexes
    share none, so every bridge up to both root ports counts (the traffic crosses the CPU's own
    fabric between them: nvidia-smi topo's NODE or SYS).
    """
    common = set(first.bridges) & set(second.bridges) if first.root == second.root else set()
    out = []
    for gpu in (first, second):
        for bridge in gpu.bridges:
            if bridge in common:
                break
            out.append(bridge)
    return out


def generation(gt_s: str | None) -> int | None:
    """PCIe generation of a transfer rate as lspci prints it ("32", "2.5")."""
    if gt_s is None:
        return None
    return GT_S_TO_GENERATION.get(gt_s.rstrip("0").rstrip(".") if "." in gt_s else gt_s)
