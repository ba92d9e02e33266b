"""Fabric checks that need no NVIDIA driver: they read a snapshot (pd_appliance.fabric.collect).

Each check looks at the PCIe path KV cache and NCCL take between the host's PD GPUs (prefill and
decode, the lab default across both NUMA nodes) and returns findings; the policy decides whether
a finding fails preflight or warns. What each one protects against, from practitioners' reports on
RTX PRO 6000 servers (the issues named at each check, checked 2026-12-02):

- iommu: a GPU whose IOMMU group translates DMA ("DMA", "DMA-FQ") routes peer traffic through the
  IOMMU; NCCL and P2P hang (vLLM 33041, NCCL 1999).
- acs: ACS request/completion redirect on a bridge between the GPUs sends peer-to-peer traffic up
  to the root complex; with the IOMMU that hangs (NCCL 2079: AMD root ports with ACSCtl
  ReqRedir+ CmpltRedir+).
- bar1: a BIOS without resizable BAR leaves BAR1 at 256 MB instead of covering the 96 GB of an RTX
  PRO 6000; peers then cannot map its memory.
- uvm_hmm: HMM in nvidia_uvm makes CUDA initialisation fail on some kernels; NVIDIA's workaround
  is `options nvidia_uvm uvm_disable_hmm=1` (CUDA 13 release notes, known issues).
- aspm: PCIe ASPM on a GPU's link causes "surprise link down" lock-ups.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pd_appliance.fabric import pcie
from pd_appliance.fabric.findings import Finding

TRANSLATING_IOMMU_TYPES = ("DMA", "DMA-FQ")
PASSTHROUGH_CMDLINE = re.compile(r"(?:^|\s)(?:iommu=pt|iommu\.passthrough=(?:1|y|on))(?:\s|$)")
IOMMU_OFF_CMDLINE = re.compile(r"(?:^|\s)(?:intel_iommu=off|amd_iommu=off|iommu=off)(?:\s|$)")
HMM_OFF_MODPROBE = re.compile(r"^\s*options\s+nvidia[-_]uvm\s+.*\buvm_disable_hmm=(?:1|y|Y)\b", re.MULTILINE)
HMM_OFF_CMDLINE = re.compile(r"(?:^|\s)nvidia[-_]uvm\.uvm_disable_hmm=(?:1|y|Y)(?:\s|$)")
ASPM_OFF_CMDLINE = re.compile(r"(?:^|\s)pcie_aspm=off(?:\s|$)")
ASPM_POWER_POLICIES = ("powersave", "powersupersave")
IOMMU_FIX = (
    "add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, then "
    "update-grub and reboot) so host devices are identity-mapped, or turn VT-d / AMD-Vi (IOMMU) off "
    "in the BIOS; /sys/kernel/iommu_groups/<group>/type must then read 'identity'"
)
ACS_FIX = (
    "disable ACS in the BIOS (PCIe ACS / 'ACS Enable' for the root ports and switches); or keep it off "
    "across reboots with the kernel parameter pci=disable_acs_redir={bridges} (Linux 4.19+); for a test "
    "without reboot, `setpci -s <bridge> ECAP_ACS+0x6.w=0000` on each bridge (NCCL troubleshooting guide)"
)
BAR1_FIX = (
    "enable 'Above 4G Decoding' and 'Re-Size BAR Support' (resizable BAR) in the BIOS, with enough "
    "MMIO high space for every GPU; after a reboot `lspci -vvv -s {address} | grep -A4 'Resizable BAR'` "
    "shows BAR 1 at its largest size"
)
HMM_FIX = (
    "write 'options nvidia_uvm uvm_disable_hmm=1' to /etc/modprobe.d/uvm.conf, then reload nvidia_uvm "
    "(modprobe -r nvidia_uvm && modprobe nvidia_uvm) or reboot"
)
ASPM_FIX = (
    "add pcie_aspm=off to the kernel command line (GRUB_CMDLINE_LINUX, update-grub, reboot) or disable "
    "ASPM / PCIe power management for the GPU slots in the BIOS; for now `echo performance > "
    "/sys/module/pcie_aspm/parameters/policy`"
)
LSPCI_FIX = (
    "install pciutils (apt-get install pciutils) and run preflight with become: true, so lspci can "
    "read the extended capabilities"
)


def _gpu_label(gpu: pcie.PciGpu, roles: dict[int, str]) -> str:
    role = roles.get(gpu.index)
    return f"GPU {gpu.index} ({gpu.address}{', ' + role if role else ''})"


def _lspci_gap(
    snapshot: dict[str, Any], devices: dict[str, pcie.LspciDevice], addresses: list[str]
) -> str | None:
    """Why lspci cannot answer for `addresses`, or None when it can."""
    if snapshot.get("lspci") is None:
        return snapshot.get("lspci_error") or "lspci was not run"
    missing = [a for a in addresses if a not in devices]
    if missing:
        return f"lspci printed nothing for {', '.join(missing)}"
    denied = [a for a in addresses if devices[a].access_denied]
    if denied:
        return f"lspci was denied the capabilities of {', '.join(denied)} (not root)"
    return None


def iommu_findings(
    snapshot: dict[str, Any], host: str, chosen: list[pcie.PciGpu], roles: dict[int, str]
) -> list[Finding]:
    """GPUs whose DMA the IOMMU translates (their group's type is DMA or DMA-FQ)."""
    files = snapshot.get("sysfs", {})
    cmdline = snapshot.get("cmdline", "")
    found = []
    for gpu in chosen:
        if gpu.iommu_group is None:
            continue  # no IOMMU group: the IOMMU is off or does not cover the GPU
        kind = files.get(f"kernel/iommu_groups/{gpu.iommu_group}/type")
        if kind is None:
            if PASSTHROUGH_CMDLINE.search(cmdline) or IOMMU_OFF_CMDLINE.search(cmdline):
                continue
            kind = "unknown (no type file), and /proc/cmdline has no iommu=pt"
        elif kind not in TRANSLATING_IOMMU_TYPES:
            continue
        found.append(
            Finding(
                "iommu",
                host,
                _gpu_label(gpu, roles),
                f"IOMMU group {gpu.iommu_group} translates the GPU's DMA (type {kind}); peer-to-peer "
                f"traffic between the PD GPUs goes through the IOMMU and NCCL/P2P can hang "
                f"(/proc/cmdline: {cmdline or 'empty'}).",
                IOMMU_FIX,
            )
        )
    return found


def acs_findings(
    snapshot: dict[str, Any],
    host: str,
    chosen: list[pcie.PciGpu],
    pairs: list[tuple[pcie.PciGpu, pcie.PciGpu]],
    roles: dict[int, str],
) -> list[Finding]:
    """Bridges on a PD GPU pair's path whose ACS control redirects peer-to-peer requests."""
    devices = pcie.parse_lspci(snapshot.get("lspci"))
    on_path: dict[str, list[str]] = {}
    for first, second in pairs:
        for bridge in pcie.path_bridges(first, second):
            on_path.setdefault(bridge, [])
            label = f"GPU {first.index} -> GPU {second.index}"
            if label not in on_path[bridge]:
                on_path[bridge].append(label)
    if not on_path:
        return []
    gap = _lspci_gap(snapshot, devices, sorted(on_path))
    if gap:
        return [
            Finding(
                "acs",
                host,
                f"{len(on_path)} bridge(s) between the PD GPUs",
                f"ACS state cannot be read: {gap}.",
                LSPCI_FIX,
            )
        ]
    redirecting = []
    for bridge in sorted(on_path):
        ctl = devices[bridge].acs_ctl
        if ctl and any(ctl.get(flag) for flag in pcie.ACS_REDIRECT_FLAGS):
            on = [f for f in pcie.ACS_REDIRECT_FLAGS if ctl.get(f)]
            redirecting.append((bridge, on))
    found = []
    for bridge, on in redirecting:
        found.append(
            Finding(
                "acs",
                host,
                f"bridge {bridge} ({devices[bridge].description.split(':')[0]})",
                f"ACS {'+, '.join(on)}+ is set on the path {', '.join(on_path[bridge][:3])}"
                f"{' and more' if len(on_path[bridge]) > 3 else ''}: peer-to-peer requests are redirected "
                "to the root complex, and with the IOMMU on, NCCL and P2P hang.",
                ACS_FIX.format(bridges=";".join(b for b, _ in redirecting)),
            )
        )
    return found


def bar1_findings(
    host: str, chosen: list[pcie.PciGpu], min_bar1_mib: int, snapshot: dict[str, Any]
) -> list[Finding]:
    """GPUs whose BAR1 (from sysfs `resource`) is smaller than `min_bar1_mib`."""
    devices = pcie.parse_lspci(snapshot.get("lspci"))
    found = []
    for gpu in chosen:
        if gpu.bar1_bytes is None or pcie.mib(gpu.bar1_bytes) >= min_bar1_mib:
            continue
        rebar = devices.get(gpu.address, pcie.LspciDevice(gpu.address, "")).rebar
        largest = max((supported for _, supported in rebar.values()), default=0)
        can = f"; the GPU supports {pcie.mib(largest)} MiB (lspci: Physical Resizable BAR)" if largest else ""
        found.append(
            Finding(
                "bar1",
                host,
                f"GPU {gpu.index} ({gpu.address})",
                f"BAR1 is {pcie.mib(gpu.bar1_bytes)} MiB, below {min_bar1_mib} MiB{can}: peers cannot map "
                "the GPU's memory, so P2P and CUDA IPC transfers are crippled.",
                BAR1_FIX.format(address=gpu.address),
            )
        )
    return found


def hmm_findings(snapshot: dict[str, Any], host: str) -> list[Finding]:
    """HMM not disabled for nvidia_uvm (modprobe config, kernel command line or the loaded module)."""
    loaded = snapshot.get("sysfs", {}).get("module/nvidia_uvm/parameters/uvm_disable_hmm")
    configured = any(HMM_OFF_MODPROBE.search(text) for text in snapshot.get("modprobe", {}).values())
    configured = configured or bool(HMM_OFF_CMDLINE.search(snapshot.get("cmdline", "")))
    if loaded is not None:
        if loaded in ("1", "Y", "y"):
            return []
        state = f"nvidia_uvm is loaded with uvm_disable_hmm={loaded}"
        state += " (the configuration sets 1: reload the module)" if configured else ""
    elif configured:
        return []
    else:
        state = "no modprobe configuration sets uvm_disable_hmm=1 for nvidia_uvm"
    return [
        Finding(
            "uvm_hmm",
            host,
            "nvidia_uvm",
            f"{state}; with HMM on, CUDA initialisation fails on some kernels (CUDA 13 release notes).",
            HMM_FIX,
        )
    ]


def aspm_findings(
    snapshot: dict[str, Any], host: str, chosen: list[pcie.PciGpu], roles: dict[int, str]
) -> list[Finding]:
    """Links of the PD GPUs (the GPU and every bridge above it) with ASPM enabled."""
    cmdline = snapshot.get("cmdline", "")
    devices = pcie.parse_lspci(snapshot.get("lspci"))
    addresses = sorted({a for gpu in chosen for a in [gpu.address, *gpu.bridges]})
    gap = _lspci_gap(snapshot, devices, addresses)
    if gap:
        policy = snapshot.get("sysfs", {}).get("module/pcie_aspm/parameters/policy", "")
        active = re.search(r"\[(\w+)\]", policy)
        if ASPM_OFF_CMDLINE.search(cmdline) or (active and active.group(1) == "performance"):
            return []
        return [
            Finding(
                "aspm",
                host,
                "PD GPU links",
                f"ASPM state cannot be read ({gap}); the kernel's ASPM policy is "
                f"{active.group(1) if active else 'unknown'} and /proc/cmdline has no pcie_aspm=off.",
                LSPCI_FIX + "; or " + ASPM_FIX,
            )
        ]
    found = []
    for address in addresses:
        aspm = devices[address].aspm
        if aspm and aspm != "Disabled" and "Enabled" in aspm:
            below = [g.index for g in chosen if address == g.address or address in g.bridges]
            found.append(
                Finding(
                    "aspm",
                    host,
                    f"link of {address} ({'GPU' if any(address == g.address for g in chosen) else 'bridge'} "
                    f"above GPU {', '.join(map(str, below))})",
                    f"ASPM {aspm}: a GPU link that enters a power-saving state can drop ('surprise link "
                    "down') and take the GPU off the bus.",
                    ASPM_FIX,
                )
            )
    return found


def pd_pairs(
    chosen: list[pcie.PciGpu], prefill: Iterable[int], decode: Iterable[int]
) -> list[tuple[pcie.PciGpu, pcie.PciGpu]]:
    """Every prefill -> decode pair on this host, then every pair inside each group (TP's NCCL)."""
    by_index = {gpu.index: gpu for gpu in chosen}
    p = [by_index[i] for i in prefill if i in by_index]
    d = [by_index[i] for i in decode if i in by_index]
    pairs = [(a, b) for a in p for b in d if a.index != b.index]
    for group in (p, d):
        pairs += [(a, b) for i, a in enumerate(group) for b in group[i + 1 :]]
    return pairs


def snapshot_findings(
    snapshot: dict[str, Any],
    host: str,
    prefill: list[int],
    decode: list[int],
    min_bar1_mib: int,
) -> list[Finding]:
    """Every no-driver fabric finding for `host`, whose PD GPUs are `prefill` and `decode` (NVML indices)."""
    all_gpus = pcie.gpus(snapshot)
    wanted = set(prefill) | set(decode)
    chosen = [gpu for gpu in all_gpus if gpu.index in wanted]
    roles = {i: "prefill" for i in prefill} | {i: "decode" for i in decode if i not in prefill}
    found = hmm_findings(snapshot, host)
    if not chosen:
        return found  # no GPU on the bus: preflight's GPU count reports that, with its own fix
    found += iommu_findings(snapshot, host, chosen, roles)
    found += acs_findings(snapshot, host, chosen, pd_pairs(chosen, prefill, decode), roles)
    found += bar1_findings(host, chosen, min_bar1_mib, snapshot)
    found += aspm_findings(snapshot, host, chosen, roles)
    return found
