"""Record what the kernel says about the GPUs' PCIe fabric, before any NVIDIA driver exists.

Preflight copies this file to the host and runs it with the host's own python3 (it needs only
the standard library), so the facts come from the host as it is: sysfs (the PCI tree, BARs, IOMMU
groups, link speeds, module parameters), `lspci -vvv` (ACS and ASPM control, resizable BAR),
/proc/cmdline and the modprobe configuration. The output is one JSON document, a *snapshot*; the
checks in pd_appliance.fabric.checks read only snapshots, so a recorded one replays exactly.

Usage: `python3 collect.py [--sysfs-root /sys] [--proc-root /proc] [--lspci PATH]`. A sysfs root
other than the kernel's is a stand-in's tree (preflight_sysfs_root); one that holds a `STAND-IN`
file names itself there, and the snapshot carries its words (`stand_in`) for preflight to print.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SNAPSHOT_SCHEMA = 1
NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")
# Attributes read for every NVIDIA GPU and every bridge above one.
DEVICE_FILES = (
    "vendor",
    "device",
    "class",
    "resource",
    "numa_node",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
)
# Module parameters that decide HMM (nvidia_uvm) and the PCIe ASPM policy.
MODULE_PARAMETERS = ("module/nvidia_uvm/parameters/uvm_disable_hmm", "module/pcie_aspm/parameters/policy")
MODPROBE_DIRS = (
    "/etc/modprobe.d",
    "/run/modprobe.d",
    "/usr/local/lib/modprobe.d",
    "/usr/lib/modprobe.d",
    "/lib/modprobe.d",
)
LSPCI_TIMEOUT_S = 60


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _is_gpu(dev: Path) -> bool:
    return _read(dev / "vendor") == NVIDIA_VENDOR and (_read(dev / "class") or "").startswith(
        GPU_CLASS_PREFIXES
    )


def _ancestors(real: Path) -> list[str]:
    """PCI addresses above a device in /sys/devices (its bridges, nearest first)."""
    return [part.name for part in real.parents if part.name.count(":") == 2 and "." in part.name]


def collect_sysfs(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(files, links) under `root` that the checks read: GPUs, their bridges, IOMMU, modules."""
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    devices = root / "bus" / "pci" / "devices"
    wanted: set[str] = set()
    for dev in sorted(devices.iterdir()) if devices.is_dir() else []:
        if _is_gpu(dev):
            wanted.add(dev.name)
            wanted.update(_ancestors(dev.resolve()))
    for name in sorted(wanted):
        dev = devices / name
        rel = f"bus/pci/devices/{name}"
        links[rel] = os.readlink(dev) if dev.is_symlink() else str(dev.resolve().relative_to(root.resolve()))
        for attr in DEVICE_FILES:
            value = _read(dev / attr)
            if value is not None:
                files[f"{rel}/{attr}"] = value
        group = dev / "iommu_group"
        if group.is_symlink():
            links[f"{rel}/iommu_group"] = os.readlink(group)
    groups = root / "kernel" / "iommu_groups"
    for group in sorted(groups.iterdir()) if groups.is_dir() else []:
        value = _read(group / "type")
        if value is not None:
            files[f"kernel/iommu_groups/{group.name}/type"] = value
    iommu_class = root / "class" / "iommu"
    for unit in sorted(iommu_class.iterdir()) if iommu_class.is_dir() else []:
        files[f"class/iommu/{unit.name}"] = ""
    for param in MODULE_PARAMETERS:
        value = _read(root / param)
        if value is not None:
            files[param] = value
    return files, links


def find_lspci() -> str | None:
    """pciutils' lspci on PATH or where distributions put it; None if not installed."""
    return shutil.which("lspci") or next(
        (p for p in ("/usr/bin/lspci", "/sbin/lspci") if Path(p).exists()), None
    )


def run_lspci(addresses: list[str], exe: str | None = None) -> tuple[str | None, str | None]:
    """`lspci -vvv -D -s ADDR` for each address, concatenated; (text, None) or (None, why not).
    `exe` is the lspci to run (preflight_lspci), else pciutils' own (find_lspci)."""
    if not addresses:
        return "", None
    exe = exe or find_lspci()
    if exe is None:
        return None, "lspci is not installed (package pciutils)"
    chunks = []
    for address in addresses:
        try:
            done = subprocess.run(
                [exe, "-vvv", "-D", "-s", address],
                capture_output=True,
                text=True,
                timeout=LSPCI_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, f"lspci failed: {err}"
        if done.returncode != 0:
            return None, f"lspci -s {address} exited {done.returncode}: {done.stderr.strip()[:200]}"
        chunks.append(done.stdout.rstrip("\n"))
    return "\n\n".join(chunks) + "\n", None


def collect_modprobe(dirs: tuple[str, ...] = MODPROBE_DIRS) -> dict[str, str]:
    """Lines of modprobe configuration that name an NVIDIA module, by file."""
    found: dict[str, str] = {}
    for directory in dirs:
        base = Path(directory)
        for conf in sorted(base.glob("*.conf")) if base.is_dir() else []:
            text = _read(conf) or ""
            lines = [line for line in text.splitlines() if "nvidia" in line]
            if lines:
                found[str(conf)] = "\n".join(lines)
    return found


def collect(
    sysfs_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    modprobe_dirs: tuple[str, ...] = MODPROBE_DIRS,
    lspci: Callable[[list[str]], tuple[str | None, str | None]] = run_lspci,
) -> dict[str, Any]:
    """The snapshot of this host (see the module docstring)."""
    files, links = collect_sysfs(sysfs_root)
    addresses = sorted(
        {rel.split("/")[3] for rel in links if rel.startswith("bus/pci/devices/") and rel.count("/") == 3}
    )
    lspci_text, lspci_error = lspci(addresses)
    return {
        "schema": SNAPSHOT_SCHEMA,
        "sysfs": files,
        "links": links,
        "cmdline": _read(proc_root / "cmdline") or "",
        "lspci": lspci_text,
        "lspci_error": lspci_error,
        "modprobe": collect_modprobe(modprobe_dirs),
        "euid": os.geteuid(),
        "stand_in": _read(sysfs_root / "STAND-IN"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"))
    parser.add_argument("--lspci", default="", help="the lspci to run (default: pciutils' own)")
    args = parser.parse_args(argv)

    def lspci(addresses: list[str]) -> tuple[str | None, str | None]:
        return run_lspci(addresses, args.lspci or None)

    snapshot = collect(args.sysfs_root, args.proc_root, lspci=lspci)
    json.dump(snapshot, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
