"""The GPU stand-in's PCI tree (pd_standins.sysfs) read by the product's own collector.

Preflight reads the PCI bus before any driver exists (sysfs, lspci); a rehearsal points
preflight_sysfs_root and preflight_lspci at this tree. The collector (pd_appliance.fabric.collect)
must see in it exactly the PCI fabric the simulated GPUs compose, the lspci must answer as pciutils'
does per address, and the tree must name itself (STAND-IN) where the kernel's sysfs never does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pd_appliance.fabric import collect
from pd_standins import sysfs
from pd_standins.gpus import simulated_gpu, simulated_pci_snapshot
from pd_testlib import ROOT

COLLECT = ROOT / "src" / "pd_appliance" / "fabric" / "collect.py"


def _collect(tree: Path) -> dict[str, object]:
    """The collector as preflight runs it: a script under the host's python3, with both options."""
    done = subprocess.run(
        [
            sys.executable,
            str(COLLECT),
            "--sysfs-root",
            str(tree / "sys"),
            "--lspci",
            str(tree / "bin" / "lspci"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    snapshot: dict[str, object] = json.loads(done.stdout)
    return snapshot


def test_the_collector_reads_the_composed_pci_fabric_from_the_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    assert sysfs.ensure_tree(tree, 8) is True
    composed = simulated_pci_snapshot([simulated_gpu(i) for i in range(8)])
    snapshot = _collect(tree)
    files = snapshot["sysfs"]
    assert isinstance(files, dict)
    # Every composed file and link, as composed; beyond them only the host's own module parameters.
    assert {k: files.get(k) for k in composed["sysfs"]} == composed["sysfs"]
    assert set(files) - set(composed["sysfs"]) <= set(collect.MODULE_PARAMETERS)
    assert snapshot["links"] == composed["links"]
    assert snapshot["lspci_error"] is None
    lspci = str(snapshot["lspci"])
    assert sorted(lspci.strip("\n").split("\n\n")) == sorted(composed["lspci"].strip("\n").split("\n\n"))
    assert snapshot["stand_in"] == sysfs.STAND_IN


def test_the_tree_counts_its_gpus_as_preflight_counts_them(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    sysfs.ensure_tree(tree, 4)
    devices = sorted((tree / "sys" / "bus" / "pci" / "devices").iterdir())
    nvidia = [d for d in devices if (d / "vendor").read_text().strip() == "0x10de"]
    # Each pair of GPUs: a root port, a switch upstream port and two downstream ports.
    assert len(nvidia) == 4 and len(devices) == 4 + 2 * 4
    assert all((d / "class").read_text().startswith("0x0302") for d in nvidia)


def test_the_tree_is_written_once_and_rewritten_when_it_changes(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    assert sysfs.ensure_tree(tree, 2) is True
    assert sysfs.ensure_tree(tree, 2) is False
    assert sysfs.ensure_tree(tree, 4) is True
    assert len(list((tree / "lspci").iterdir())) == 4 + 2 * 4
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]  # no half-built tree left beside it


def test_the_module_runs_with_a_hosts_python(tmp_path: Path) -> None:
    """prepare.yml runs it on a scenario's host with only pd_standins on PYTHONPATH."""
    run = [sys.executable, "-m", "pd_standins.sysfs", "--out", str(tmp_path / "tree"), "--gpus", "2"]
    env = {"PYTHONPATH": str(ROOT / "standins" / "src")}
    assert subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout == "written\n"
    assert subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout == "present\n"


def test_the_kernels_sysfs_names_no_stand_in(tmp_path: Path) -> None:
    """A tree without a STAND-IN file (the kernel's) gives no stand_in, and the lspci option
    defaults to pciutils' own."""
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    snapshot = collect.collect(tmp_path, tmp_path, (), lambda addresses: ("", None))
    assert snapshot["stand_in"] is None


def test_the_lspci_option_runs_the_named_lspci(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    sysfs.ensure_tree(tree, 2)
    text, error = collect.run_lspci(["0000:18:00.0"], str(tree / "bin" / "lspci"))
    assert error is None and text is not None
    assert text.startswith("0000:18:00.0 3D controller: NVIDIA Corporation GB202GL")
    text, error = collect.run_lspci(["0000:18:00.0"], str(tmp_path / "missing-lspci"))
    assert text is None and error is not None and "lspci failed" in error
