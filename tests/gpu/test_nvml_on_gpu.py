"""pd_nvml_facts against a real GPU (the lent H200): the facts must agree with nvidia-smi.

Skipped wherever no NVIDIA driver answers; run on the device with `pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pd_appliance.gpu import GpuFactsError, gather_gpu_facts
from pd_appliance.gpu.facts import GPU_KEYS

pytestmark = pytest.mark.gpu


def _nvidia_smi(fields: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.strip().splitlines()]


@pytest.fixture(scope="module")
def facts() -> dict:
    if shutil.which("nvidia-smi") is None or not Path("/dev/nvidiactl").exists():
        pytest.skip("no NVIDIA driver on this machine (runs on the lent GPU)")
    try:
        return gather_gpu_facts()
    except GpuFactsError as err:
        pytest.fail(f"pd_nvml_facts failed on a GPU host: {err}")


def test_every_gpu_matches_nvidia_smi(facts: dict) -> None:
    rows = _nvidia_smi("index,uuid,compute_cap,memory.total,pci.bus_id,driver_version")
    assert len(facts["pd_gpus"]) == len(rows) > 0
    for gpu, (index, uuid, cap, mem, bus_id, driver) in zip(facts["pd_gpus"], rows, strict=True):
        assert set(gpu) == set(GPU_KEYS)
        assert gpu["index"] == int(index)
        assert gpu["uuid"] == uuid
        assert gpu["compute_capability"] == cap
        assert gpu["memory_total_mib"] == int(mem)
        assert gpu["pci_bus_id"].lower() == bus_id.lower()
        assert facts["pd_gpu_driver_version"] == driver
        assert gpu["stand_in"] is None
        assert gpu["pcie_generation"] >= 1 and gpu["pcie_width"] >= 1


def test_numa_and_cpus_come_from_sysfs(facts: dict) -> None:
    for gpu in facts["pd_gpus"]:
        address = gpu["pci_bus_id"].lower()[4:]
        node = int(Path(f"/sys/bus/pci/devices/{address}/numa_node").read_text())
        assert gpu["numa_node"] == (node if node >= 0 else None)
        assert gpu["cpu_list"] == Path(f"/sys/bus/pci/devices/{address}/local_cpulist").read_text().strip()


def test_topology_is_square_with_self_on_the_diagonal(facts: dict) -> None:
    count = len(facts["pd_gpus"])
    topology = facts["pd_gpu_pcie"]
    for key in ("link", "p2p_read", "p2p_write", "p2p_atomics"):
        assert len(topology[key]) == count
        assert all(len(row) == count and row[i] == "X" for i, row in enumerate(topology[key]))
    assert facts["pd_gpu_cuda_version"].split(".")[0].isdigit()
