"""A sysfs fixture tree and an lspci for the simulated GPUs: the PCI side of the GPU stand-in.

Preflight runs before any driver exists, so it reads the GPUs off the PCI bus (sysfs, `lspci -vvv`),
not NVML. A host without NVIDIA GPUs shows none there; the product reads the tree at
preflight_sysfs_root and runs the lspci at preflight_lspci, and a rehearsal points both here: a
directory holding

- `sys/`: the PCI tree pd_standins.gpus.simulated_pci_snapshot composes for the simulated GPUs
  (devices, their bridges' symlinks, IOMMU group types), with `module` and `class/iommu` linked to
  the host's own /sys, so module parameters (HMM, ASPM policy) and the IOMMU units stay the host's;
  and `STAND-IN`, the words this stand-in names itself with (the product prints `STAND-IN (<them>)`);
- `bin/lspci`: a script answering `lspci -vvv -D -s ADDR` with the composed text for ADDR.

Usage: `python3 -m pd_standins.sysfs --out DIR [--gpus 8]` (prints "written" or "present");
standins/prepare.yml runs it on a scenario's hosts, the pd_standins_sysfs_root filter on the
controller (the local rehearsal's host). Standard library only: it runs with a host's own python3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pd_standins import gpus
from pd_standins.gpus import simulated_gpu, simulated_pci_snapshot

# What the tree names itself with (read by the product from <sysfs root>/STAND-IN).
STAND_IN = (
    "PCI tree of the simulated GPUs (pd_standins.sysfs, standins/declared.yml): no NVIDIA GPU is on the "
    "PCI bus of this host -> the GPU count and the fabric checks read the tree the simulated GPUs declare "
    "(a healthy lab host), with the /proc/cmdline, modprobe.d and module parameters of this host"
)
DEFAULT_GPU_COUNT = 8
HOST_LINKS = {"module": "/sys/module", "class/iommu": "/sys/class/iommu"}
LSPCI = """#!/bin/sh
# STAND-IN lspci (pd_standins.sysfs): answers `lspci -vvv -D -s ADDR` for the simulated GPUs' PCI tree.
addr=
while [ $# -gt 0 ]; do
  if [ "$1" = -s ]; then shift; addr=$1; fi
  shift
done
exec cat "$(dirname "$0")/../lspci/$addr"
"""


def _blocks(lspci: str) -> dict[str, str]:
    """The composed `lspci -vvv -D` text, split into each device's block by its address."""
    blocks: dict[str, str] = {}
    for block in lspci.split("\n\n"):
        if block.strip():
            blocks[block.split(" ", 1)[0]] = block.strip("\n") + "\n"
    return blocks


def write_tree(out: Path, gpu_count: int = DEFAULT_GPU_COUNT) -> None:
    """Write the fixture tree (module docstring) for `gpu_count` simulated GPUs into `out` (new)."""
    snapshot = simulated_pci_snapshot([simulated_gpu(index) for index in range(gpu_count)])
    sys_root = out / "sys"
    devices = sys_root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    for rel, target in snapshot["links"].items():
        link = sys_root / rel
        if rel.endswith("/iommu_group"):
            link.symlink_to(target)  # read back as a link only (collect.py), never followed
            continue
        (link.parent / target).mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
    for rel, value in snapshot["sysfs"].items():
        path = sys_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    for rel, target in HOST_LINKS.items():
        (sys_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (sys_root / rel).symlink_to(target)
    (sys_root / "STAND-IN").write_text(STAND_IN + "\n")
    (out / "lspci").mkdir()
    for address, block in _blocks(snapshot["lspci"]).items():
        (out / "lspci" / address).write_text(block)
    (out / "bin").mkdir()
    (out / "bin" / "lspci").write_text(LSPCI)
    (out / "bin" / "lspci").chmod(0o755)


def ensure_tree(out: Path, gpu_count: int = DEFAULT_GPU_COUNT) -> bool:
    """Make `out` hold the tree for `gpu_count` GPUs; False if it did already. Written beside and
    renamed into place, so runs side by side (tests, scenarios) never see half a tree."""
    stamp = json.dumps({"gpus": gpu_count, "stand_in": STAND_IN, "lspci": LSPCI})
    if (out / "complete").is_file() and (out / "complete").read_text() == stamp:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    write_tree(building, gpu_count)
    (building / "complete").write_text(stamp)
    if out.exists():
        shutil.rmtree(out)
    try:
        os.rename(building, out)
    except OSError:  # another run put its (identical) tree there first
        shutil.rmtree(building, ignore_errors=True)
    return True


def controller_tree(gpu_count: int = DEFAULT_GPU_COUNT) -> str:
    """The tree's sysfs root on this machine (the local rehearsal's host), written on first use in the
    temporary directory, named by its content so a changed stand-in gets a fresh one."""
    sources = b"".join(Path(name).read_bytes() for name in (__file__, gpus.__file__))
    digest = hashlib.sha256(sources + str(gpu_count).encode()).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"pd-standins-sysfs-{os.getuid()}-{digest}"
    ensure_tree(out, gpu_count)
    return str(out / "sys")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpus", type=int, default=DEFAULT_GPU_COUNT)
    args = parser.parse_args(argv)
    print("written" if ensure_tree(args.out, args.gpus) else "present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
