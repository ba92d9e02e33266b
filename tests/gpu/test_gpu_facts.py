"""pd_appliance.gpu with NVML replayed from the H200 recording, and every failure diagnosis."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest
from fake_nvml import FIXTURES, FakeNvml, write_sysfs

from pd_appliance.gpu import (
    DriverMismatchError,
    GpuFactsError,
    GpuLostError,
    ModuleLoadError,
    NoDriverError,
    NoGpuError,
    SecureBootUnsignedError,
    gather_gpu_facts,
    load_nvml,
)
from pd_appliance.gpu.diagnose import HostProbe
from pd_appliance.gpu.facts import GPU_KEYS, cpu_list_from_mask
from pd_appliance.gpu.sysfs import SECURE_BOOT_EFIVAR, nvidia_pci_gpus, sysfs_pci_address
from pd_standins import nvml as standin_nvml
from pd_standins.gpus import simulated_gpu

RECORDED_FACTS = json.loads((FIXTURES / "nvml_facts.json").read_text())
# Recorded before issue 25: a GPU NVML reads now says stand_in None, the facts no longer carry the
# `simulated` mark (a stand-in names itself instead), and the PCIe matrices' fact is pd_gpu_pcie
# (it was pd_gpu_topology, a name serving's topology also used).
for _gpu in RECORDED_FACTS["pd_gpus"]:
    _gpu.setdefault("stand_in", None)
    _gpu.pop("simulated")
RECORDED_FACTS["pd_gpu_pcie"] = RECORDED_FACTS.pop("pd_gpu_topology")
RECORDED_FACTS["pd_gpu_pcie"].pop("simulated")


def _probe(root: Path, log: list[str] | None = None, signer: str | None = "") -> HostProbe:
    return HostProbe(
        sysfs_root=root,
        kernel_log=lambda: list(log or []),
        module_signer=lambda _m: signer,
        kernel_release="6.8.0-1",
    )


def _host(tmp_path: Path, nvml: FakeNvml) -> HostProbe:
    write_sysfs(tmp_path, nvml.devices)
    return _probe(tmp_path)


def test_recorded_h200_parses_to_the_facts_recorded_on_the_device(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded()
    facts = gather_gpu_facts(nvml, _host(tmp_path, nvml))
    assert facts == RECORDED_FACTS
    assert set(facts["pd_gpus"][0]) == set(GPU_KEYS)
    assert nvml.shutdowns == 1


def test_numa_node_minus_one_is_unknown_but_cpu_list_is_kept(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded()
    nvml.devices[0]["sysfs_numa_node"] = "1"
    nvml.devices[0]["sysfs_local_cpulist"] = "32-63,96-127"
    gpu = gather_gpu_facts(nvml, _host(tmp_path, nvml))["pd_gpus"][0]
    assert (gpu["numa_node"], gpu["cpu_list"]) == (1, "32-63,96-127")
    assert RECORDED_FACTS["pd_gpus"][0]["numa_node"] is None  # the H200 VM's sysfs says -1


def test_ecc_and_persistence_not_supported_become_none(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded()
    nvml.devices[0]["ecc_uncorrected_volatile"] = {"error": 3}
    nvml.devices[0]["persistence_mode"] = {"value": 0}
    gpu = gather_gpu_facts(nvml, _host(tmp_path, nvml))["pd_gpus"][0]
    assert gpu["ecc_errors_uncorrected"] is None
    assert gpu["persistence_mode"] is False


def _two_gpus() -> FakeNvml:
    nvml = FakeNvml.recorded()
    second = copy.deepcopy(nvml.devices[0])
    second.update(uuid="GPU-second", bus_id="00000000:00:07.0")
    nvml.devices.append(second)
    return nvml


def test_topology_names_pcie_levels_and_p2p_status(tmp_path: Path) -> None:
    nvml = _two_gpus()
    nvml.ancestor[(0, 1)] = 50
    nvml.p2p[(0, 1, 1)] = 3  # write: IOH topology not supported
    topology = gather_gpu_facts(nvml, _host(tmp_path, nvml))["pd_gpu_pcie"]
    assert topology["link"] == [["X", "SYS"], ["SYS", "X"]]
    assert topology["p2p_read"] == [["X", "OK"], ["OK", "X"]]
    assert topology["p2p_write"] == [["X", "IOH_TOPOLOGY_NOT_SUPPORTED"], ["OK", "X"]]


def test_topology_counts_direct_nvlinks(tmp_path: Path) -> None:
    nvml = _two_gpus()
    nvml.nvlink_remote = {0: ["00000000:00:07.0"] * 4, 1: ["00000000:00:06.0"] * 4}
    topology = gather_gpu_facts(nvml, _host(tmp_path, nvml))["pd_gpu_pcie"]
    assert topology["link"] == [["X", "NV4"], ["NV4", "X"]]


def test_no_driver_names_the_driver_stage(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded(init_error=12)
    with pytest.raises(NoDriverError, match=re.escape("libnvidia-ml.so.1")) as err:
        gather_gpu_facts(nvml, _host(tmp_path, nvml))
    assert err.value.as_dict()["cause"] == "no_driver"
    assert "--tags driver" in err.value.fix


def test_no_gpu_on_the_bus_points_at_the_inventory(tmp_path: Path) -> None:
    with pytest.raises(NoGpuError, match="no NVIDIA GPU is on the PCI bus"):
        gather_gpu_facts(FakeNvml.recorded(init_error=12), _probe(tmp_path))


def test_secure_boot_with_unsigned_module(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded(init_error=9)
    write_sysfs(tmp_path, nvml.devices)
    efivar = tmp_path / SECURE_BOOT_EFIVAR
    efivar.parent.mkdir(parents=True)
    efivar.write_bytes(b"\x06\x00\x00\x00\x01")
    log = ["Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7"]
    with pytest.raises(SecureBootUnsignedError, match="unsigned") as err:
        gather_gpu_facts(nvml, _probe(tmp_path, log=log, signer=""))
    assert "ubuntu-signed" in err.value.fix and "mokutil --import" in err.value.fix
    assert "Lockdown" in err.value.fix


def test_secure_boot_off_unsigned_module_not_loaded_is_a_load_failure(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded(init_error=9)
    write_sysfs(tmp_path, nvml.devices)
    log = ["NVRM: The NVIDIA GPU 0000:00:06.0 installed in this system is not supported by open nvidia.ko"]
    with pytest.raises(ModuleLoadError, match=re.escape("not supported by open nvidia.ko")):
        gather_gpu_facts(nvml, _probe(tmp_path, log=log, signer=""))


def test_nouveau_holding_the_gpu(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded(init_error=9)
    write_sysfs(tmp_path, nvml.devices)
    (tmp_path / "module" / "nouveau").mkdir(parents=True)
    with pytest.raises(ModuleLoadError, match="nouveau is loaded"):
        gather_gpu_facts(nvml, _probe(tmp_path))


def test_no_module_for_the_running_kernel_names_dkms_and_headers(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded(init_error=9)
    write_sysfs(tmp_path, nvml.devices)
    with pytest.raises(ModuleLoadError, match=re.escape("6.8.0-1")) as err:
        gather_gpu_facts(nvml, _probe(tmp_path, signer=None))
    assert "dkms status" in err.value.fix and "linux-headers-6.8.0-1" in err.value.fix


def test_upgrade_without_reboot_is_a_version_mismatch(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded(init_error=18)
    write_sysfs(tmp_path, nvml.devices)
    (tmp_path / "module" / "nvidia").mkdir(parents=True)
    (tmp_path / "module" / "nvidia" / "version").write_text("580.95.05\n")
    with pytest.raises(DriverMismatchError, match=re.escape("580.95.05")) as err:
        gather_gpu_facts(nvml, _probe(tmp_path))
    assert "reboot" in err.value.fix


def test_gpu_on_the_bus_but_not_in_nvml_fell_off(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded()
    two = _two_gpus()
    write_sysfs(tmp_path, two.devices)
    log = ["NVRM: Xid (PCI:0000:00:07): 79, pid=1, GPU has fallen off the bus."]
    with pytest.raises(GpuLostError, match=re.escape("missing: 0000:00:07.0")) as err:
        gather_gpu_facts(nvml, _probe(tmp_path, log=log))
    assert "fallen off the bus" in err.value.detail and "power-cycle" in err.value.fix
    assert nvml.shutdowns == 1


def test_device_reported_lost(tmp_path: Path) -> None:
    nvml = _two_gpus()
    nvml.lost = 1
    with pytest.raises(GpuLostError, match="GPU 1 as lost"):
        gather_gpu_facts(nvml, _host(tmp_path, nvml))


def test_missing_bindings_is_a_tools_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(GpuFactsError, match="nvidia-ml-py"):
        gather_gpu_facts()


def test_sysfs_lists_only_nvidia_gpu_functions(tmp_path: Path) -> None:
    devices = FakeNvml.recorded().devices
    write_sysfs(tmp_path, devices)
    audio = dict(devices[0], bus_id="00000000:00:06.1", sysfs_class="0x040300")
    write_sysfs(tmp_path, [audio])
    nic = dict(devices[0], bus_id="00000000:00:08.0")
    write_sysfs(tmp_path, [nic], vendor="0x15b3")
    gpus = nvidia_pci_gpus(tmp_path)
    assert [(g.address, g.device_id, g.needs_open_modules) for g in gpus] == [("0000:00:06.0", 0x2335, False)]
    assert sysfs_pci_address("00000000:1A:00.0") == "0000:1a:00.0"


def test_a_stand_in_nvml_module_is_read_by_the_same_code_and_names_itself(tmp_path: Path) -> None:
    """pd_standins.nvml through gather_gpu_facts: the facts are its declared GPUs, each GPU says
    what stands in (the module's STAND_IN), and the placement comes from NVML where sysfs (an empty
    root here, as on a machine without the GPUs) does not list the device."""
    facts = gather_gpu_facts(standin_nvml, _probe(tmp_path))
    gpus = facts["pd_gpus"]
    assert [g["uuid"] for g in gpus] == [simulated_gpu(i)["uuid"] for i in range(8)]
    assert all(g["stand_in"] == standin_nvml.STAND_IN for g in gpus)
    assert all(set(g) == set(GPU_KEYS) for g in gpus)
    assert [(g["numa_node"], g["cpu_list"]) for g in gpus[3:5]] == [(0, "0-31"), (1, "32-63")]
    assert gpus[0]["bar1_total_mib"] == 131072 and gpus[0]["persistence_mode"] is True
    assert (
        facts["pd_gpu_driver_version"] == standin_nvml.DRIVER_VERSION
        and facts["pd_gpu_cuda_version"] == "13.0"
    )
    link = facts["pd_gpu_pcie"]["link"]
    assert link[0][3] == "NODE" and link[0][4] == "SYS" and link[5][5] == "X"
    assert facts["pd_gpu_pcie"]["p2p_write"][0][4] == "OK"


def test_pynvml_itself_names_no_stand_in(tmp_path: Path) -> None:
    nvml = FakeNvml.recorded()
    assert all(g["stand_in"] is None for g in gather_gpu_facts(nvml, _host(tmp_path, nvml))["pd_gpus"])


def test_sysfs_places_a_device_it_lists_and_nvml_only_one_it_does_not(tmp_path: Path) -> None:
    """A GPU sysfs lists keeps sysfs's answer even where that is "unknown" (-1): NVML's placement
    only fills in for a device this root's PCI tree does not hold."""
    nvml = FakeNvml.recorded()
    nvml.devices[0]["sysfs_numa_node"] = "-1"
    nvml.nvmlDeviceGetNumaNodeId = lambda _h: 7  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCpuAffinity = lambda _h, _n: [0xF]  # type: ignore[attr-defined]
    listed = gather_gpu_facts(nvml, _host(tmp_path, nvml))["pd_gpus"][0]
    assert listed["numa_node"] is None
    unlisted = gather_gpu_facts(nvml, _probe(tmp_path / "empty"))["pd_gpus"][0]
    assert (unlisted["numa_node"], unlisted["cpu_list"]) == (7, "0-3")


def test_cpu_affinity_words_read_as_the_kernel_s_cpu_list() -> None:
    assert cpu_list_from_mask([0xFFFFFFFF, 0]) == "0-31"
    assert cpu_list_from_mask([0b1011, 1 << 63, 1]) == "0-1,3,127-128"
    assert cpu_list_from_mask([0, 0]) is None


def test_an_nvml_module_that_does_not_import_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(GpuFactsError, match="nvml_module 'no_such_nvml'"):
        load_nvml("no_such_nvml", str(tmp_path))
    (tmp_path / "elsewhere_nvml.py").write_text("STAND_IN = 'a test'\n")
    assert load_nvml("elsewhere_nvml", str(tmp_path)).STAND_IN == "a test"
