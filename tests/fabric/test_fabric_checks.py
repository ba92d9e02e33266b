"""Fabric readiness checks replayed on snapshots: a healthy 8x RTX PRO 6000 host, each broken case,
and what the lent H200 recorded (sysfs, NVML answers). Fast, no root, no GPU."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from fabric_snapshots import CASES, CONFIG, H200, LAB_TARGETS, RTX, apply_case, load

from pd_appliance.fabric import checks, collect, findings, inventory, kv_need, nvml, pcie
from pd_appliance.gpu.diagnose import HostProbe
from pd_appliance.gpu.facts import gather_gpu_facts
from pd_standins import nvml as standin_nvml
from pd_standins.gpus import simulated_gpu, simulated_pci_snapshot

PREFILL, DECODE = [0, 1, 2, 3], [4, 5, 6, 7]
MIN_BAR1_MIB = 98304


@pytest.fixture(scope="module")
def healthy() -> dict[str, Any]:
    return load(RTX / "healthy.json")


def checks_of(found: list[findings.Finding]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in found:
        counts[f.check] = counts.get(f.check, 0) + 1
    return counts


def test_healthy_host_passes_every_preflight_check(healthy: dict[str, Any]) -> None:
    assert checks.snapshot_findings(healthy, "gpu-node-01", PREFILL, DECODE, MIN_BAR1_MIB) == []


def test_gpus_are_indexed_by_pci_address_with_their_bridges(healthy: dict[str, Any]) -> None:
    gpus = pcie.gpus(healthy)
    assert [g.address for g in gpus][:2] == ["0000:18:00.0", "0000:28:00.0"]
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[0].bridges == ["0000:17:00.0", "0000:16:00.0", "0000:15:01.0"]
    assert gpus[0].bar1_bytes == 128 * 2**30 and gpus[0].iommu_group == "30"
    # Same switch: only the two downstream ports; across sockets: every bridge up to both root ports.
    assert pcie.path_bridges(gpus[0], gpus[1]) == ["0000:17:00.0", "0000:17:01.0"]
    assert len(pcie.path_bridges(gpus[0], gpus[4])) == 6


@pytest.mark.parametrize("case", CASES)
def test_each_broken_case_fails_exactly_its_check(healthy: dict[str, Any], case: str) -> None:
    spec = load(RTX / "broken" / f"{case}.json")
    found = checks.snapshot_findings(apply_case(healthy, spec), "gpu-node-01", PREFILL, DECODE, MIN_BAR1_MIB)
    assert checks_of(found) == spec["expect"], [f.sentence() for f in found]
    for f in found:
        assert f.host == "gpu-node-01" and f.fix and f.message


def test_acs_finding_names_the_bridge_the_pairs_and_the_kernel_parameter(healthy: dict[str, Any]) -> None:
    snap = apply_case(healthy, load(RTX / "broken" / "acs-redirect.json"))
    found = checks.snapshot_findings(snap, "h", PREFILL, DECODE, MIN_BAR1_MIB)
    first = found[0].sentence()
    assert "bridge 0000:15:01.0" in first and "ReqRedir+, CmpltRedir+" in first
    assert "GPU 0 -> GPU 4" in first
    assert "pci=disable_acs_redir=0000:15:01.0;0000:35:01.0;0000:55:01.0;0000:75:01.0" in first


def test_bar1_finding_says_what_the_gpu_supports(healthy: dict[str, Any]) -> None:
    snap = apply_case(healthy, load(RTX / "broken" / "bar1-256m.json"))
    (finding,) = checks.snapshot_findings(snap, "h", PREFILL, DECODE, MIN_BAR1_MIB)
    assert finding.subject == "GPU 5 (0000:68:00.0)"
    assert "BAR1 is 256 MiB" in finding.message and "supports 131072 MiB" in finding.message


def test_only_the_pd_gpus_of_the_host_are_checked(healthy: dict[str, Any]) -> None:
    snap = apply_case(healthy, load(RTX / "broken" / "bar1-256m.json"))
    assert checks.snapshot_findings(snap, "h", [0, 1], [2, 3], MIN_BAR1_MIB) == []


def test_policy_sets_each_check_to_fail_warn_or_skip(healthy: dict[str, Any]) -> None:
    snap = apply_case(healthy, load(RTX / "broken" / "iommu-translated.json"))
    snap["modprobe"] = {}
    found = checks.snapshot_findings(snap, "h", PREFILL, DECODE, MIN_BAR1_MIB)
    default = findings.split(found, {})
    assert len(default["failures"]) == 8 and len(default["warnings"]) == 1  # iommu fails, hmm warns
    relaxed = findings.split(found, {"iommu": "warn", "uvm_hmm": "skip"})
    assert relaxed["failures"] == [] and len(relaxed["warnings"]) == 8
    with pytest.raises(ValueError, match="severity 'maybe'"):
        findings.split(found, {"iommu": "maybe"})
    with pytest.raises(ValueError, match="unknown fabric check 'acs_'"):
        findings.split(found, {"acs_": "warn"})


def test_simulated_gpus_declare_a_healthy_pci_tree_on_a_gpu_less_host() -> None:
    """The rehearsal: this machine's own snapshot (no NVIDIA GPU) with the stand-in's PCI tree."""
    host = {
        "schema": 1,
        "sysfs": {"module/pcie_aspm/parameters/policy": "[default] performance"},
        "links": {},
        "cmdline": "console=ttyS0",
        "lspci": "",
        "lspci_error": None,
        "modprobe": {"/etc/modprobe.d/uvm.conf": "options nvidia_uvm uvm_disable_hmm=1"},
    }
    merged = dict(
        host,
        **{
            k: v
            for k, v in simulated_pci_snapshot([simulated_gpu(i) for i in range(8)]).items()
            if k in ("lspci", "lspci_error")
        },
    )
    stand_in = simulated_pci_snapshot([simulated_gpu(i) for i in range(8)])
    merged["sysfs"] = {**host["sysfs"], **stand_in["sysfs"]}
    merged["links"] = stand_in["links"]
    assert len(pcie.gpus(merged)) == 8
    assert checks.snapshot_findings(merged, "localhost", PREFILL, DECODE, MIN_BAR1_MIB) == []


def test_recorded_h200_snapshot_replays(healthy: dict[str, Any]) -> None:
    """The lent H200 (a VM: no IOMMU group, BAR1 256 GiB at region 2, no lspci, HMM on)."""
    snap = load(H200 / "snapshot.json")
    (gpu,) = pcie.gpus(snap)
    assert gpu.address == "0000:00:06.0" and gpu.bar1_bytes == 256 * 2**30 and gpu.iommu_group is None
    found = checks.snapshot_findings(snap, "vm", [0], [0], MIN_BAR1_MIB)
    assert checks_of(found) == {"uvm_hmm": 1, "aspm": 1}
    assert "uvm_disable_hmm=N" in found[0].message and "lspci is not installed" in found[1].message


def _materialize(snapshot: dict[str, Any], root: Path) -> None:
    """A sysfs tree with the snapshot's files and links (the device links resolve into devices/)."""
    for rel, target in snapshot["links"].items():
        path = root / rel
        if rel.count("/") == 3:
            real = (path.parent / target).resolve()
            real.mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
    for rel, text in snapshot["sysfs"].items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def test_collector_reads_a_sysfs_tree_back_into_the_same_snapshot(
    healthy: dict[str, Any], tmp_path: Path
) -> None:
    sysfs, proc, modprobe = tmp_path / "sys", tmp_path / "proc", tmp_path / "modprobe.d"
    _materialize(healthy, sysfs)
    proc.mkdir()
    (proc / "cmdline").write_text(healthy["cmdline"] + "\n")
    modprobe.mkdir()
    (modprobe / "uvm.conf").write_text("# HMM off\noptions nvidia_uvm uvm_disable_hmm=1\n")
    asked: list[list[str]] = []

    def lspci(addresses: list[str]) -> tuple[str, None]:
        asked.append(addresses)
        return healthy["lspci"], None

    snap = collect.collect(sysfs, proc, (str(modprobe),), lspci)
    assert snap["links"] == healthy["links"]
    assert snap["sysfs"] == healthy["sysfs"]
    assert snap["cmdline"] == healthy["cmdline"]
    assert snap["modprobe"] == {str(modprobe / "uvm.conf"): "options nvidia_uvm uvm_disable_hmm=1"}
    assert len(asked[0]) == 8 + 4 + 4 + 8  # GPUs, root ports, switch upstream and downstream ports
    assert checks.snapshot_findings(snap, "h", PREFILL, DECODE, MIN_BAR1_MIB) == []


def test_collector_says_why_lspci_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collect.shutil, "which", lambda name: None)
    monkeypatch.setattr(collect.Path, "exists", lambda self: False)
    assert collect.run_lspci(["0000:18:00.0"]) == (None, "lspci is not installed (package pciutils)")


# ---- NVML-side ---------------------------------------------------------------------------------


def lab_facts(**changes: Any) -> dict[str, Any]:
    """NVML facts of a healthy 8-GPU host: the GPU stand-in's (pd_standins.nvml), as the driver stage
    reads them (no sysfs of its GPUs: NVML places them)."""
    facts = gather_gpu_facts(standin_nvml, HostProbe(sysfs_root=Path("/nonexistent-sysfs")))
    for index, fields in changes.items():
        facts["pd_gpus"][int(index.lstrip("g"))].update(fields)
    return facts


def test_simulated_host_passes_the_nvml_checks_for_real() -> None:
    facts = lab_facts()
    assert facts["pd_gpus"][0]["stand_in"] == standin_nvml.STAND_IN
    assert facts["pd_gpu_pcie"]["p2p_write"][0][4] == "OK"
    assert nvml.nvml_findings(facts["pd_gpus"], facts["pd_gpu_pcie"], "h", PREFILL, DECODE) == []


def test_cross_socket_p2p_off_warns_with_the_kv_figure_for_every_pair() -> None:
    """AMD Genoa: no P2P across sockets; NVML says CHIPSET_NOT_SUPPORTED for every SYS pair.

    The lab layout (prefill 0-3 on socket 0, decode 4-7 on socket 1) makes all 16 pairs host-staged:
    each is a warning naming the KV rate the NIXL check will require, not a failure.
    """
    facts = load(RTX / "dual-socket-nvml.json")
    need = kv_need.need_for_deployment(CONFIG, None, LAB_TARGETS, 1024, 128)
    found = nvml.nvml_findings(facts["pd_gpus"], facts["pd_gpu_pcie"], "h", PREFILL, DECODE, need)
    assert checks_of(found) == {"p2p_cross_socket": 16}
    sentence = found[0].sentence()
    assert "GPU 0 (prefill) -> GPU 4 (decode)" in sentence and "CHIPSET_NOT_SUPPORTED" in sentence
    assert "link SYS" in sentence and "different sockets" in sentence
    # 8000 prompt tok/s x 7043.6 bytes = 0.05635 GB/s per rank pair, x 10 = 0.5635 GB/s.
    assert "require the measured path to carry 0.5635 GB/s" in sentence
    assert "need 0.05635 GB/s per TP rank pair x margin 10" in sentence
    verdict = findings.split(found, {})
    assert verdict["failures"] == [] and len(verdict["warnings"]) == 16
    assert len(findings.split(found, {"p2p_cross_socket": "fail"})["failures"]) == 16
    # Without a KV figure the warning says what the NIXL check will then do.
    (bare, *_) = nvml.nvml_findings(facts["pd_gpus"], facts["pd_gpu_pcie"], "h", [0], [4])
    assert "fails that path unless nixl_check_min_bandwidth_gb_s sets a floor" in bare.message


def test_layouts_that_keep_each_pair_on_one_socket() -> None:
    """Per-socket pairs have P2P; the router pairing any prefill with any decode brings SYS back."""
    facts = load(RTX / "dual-socket-nvml.json")
    gpus, topo = facts["pd_gpus"], facts["pd_gpu_pcie"]
    # 1P TP2 + 1D TP2 on socket 0 (and the same again on socket 1, a deployment of its own).
    assert nvml.nvml_findings(gpus, topo, "h", [0, 1], [2, 3]) == []
    assert nvml.nvml_findings(gpus, topo, "h", [4, 5], [6, 7]) == []
    # 2P TP2 + 2D TP2 behind one smg router: smg picks a prefill and a decode per request on its own
    # (no pairing), so prefill 0-1 also hands KV to decode 6-7: 8 of the 16 GPU pairs cross sockets.
    found = nvml.nvml_findings(gpus, topo, "h", [0, 1, 4, 5], [2, 3, 6, 7])
    assert checks_of(found) == {"p2p_cross_socket": 8}
    assert {f.subject for f in found} >= {
        "GPU 0 (prefill) -> GPU 6 (decode)",
        "GPU 4 (prefill) -> GPU 2 (decode)",
    }


def test_the_nixl_check_measures_a_pair_across_sockets_where_the_layout_has_one() -> None:
    gpus = load(RTX / "dual-socket-nvml.json")["pd_gpus"]
    assert nvml.probe_pair(gpus, PREFILL, DECODE) == (0, 4)  # the lab layout
    # 2P TP2 + 2D TP2 with a couple per socket: first -> first (0 -> 2) shares socket 0, so the
    # check measures 0 -> 6, a pair smg can form, across the sockets.
    assert nvml.probe_pair(gpus, [0, 1, 4, 5], [2, 3, 6, 7]) == (0, 6)
    assert nvml.probe_pair(gpus, [0, 1], [2, 3]) == (0, 2)  # no pair crosses: the first one
    assert nvml.probe_pair(gpus, [0, 1], []) == (0, 0)  # a prefill-only host (two hosts)
    assert nvml.probe_pair([], [0, 1], [2, 3]) == (0, 2)  # no NVML facts yet


def test_the_checks_take_every_serving_instance_of_a_role() -> None:
    instances = [
        {"role": "prefill", "gpus": [0, 1], "tp_size": 2},
        {"role": "decode", "gpus": [2, 3], "tp_size": 2},
        {"role": "prefill", "gpus": [4, 5], "tp_size": 2},
        {"role": "decode", "gpus": [6, 7], "tp_size": 2},
        {"gpus": [9]},  # malformed: preflight's topology check names it
    ]
    assert inventory.role_gpus(instances, "prefill") == [0, 1, 4, 5]
    assert inventory.role_gpus(instances, "decode") == [2, 3, 6, 7]
    assert inventory.role_gpus("not a list", "decode") == []


def test_regkey_disabled_p2p_fails() -> None:
    """A registry key that turns P2P off is a setting to fix, across sockets too: `p2p`, a failure."""
    facts = lab_facts()
    facts["pd_gpu_pcie"]["p2p_write"][2][6] = "DISABLED_BY_REGKEY"
    (finding,) = nvml.nvml_findings(facts["pd_gpus"], facts["pd_gpu_pcie"], "h", PREFILL, DECODE)
    assert finding.check == "p2p" and "DISABLED_BY_REGKEY" in finding.message


def test_small_bar1_and_degraded_link_from_nvml() -> None:
    facts = lab_facts(g3={"bar1_total_mib": 256}, g5={"pcie_width": 8}, g6={"pcie_generation": 4})
    found = nvml.nvml_findings(facts["pd_gpus"], facts["pd_gpu_pcie"], "h", PREFILL, DECODE)
    assert checks_of(found) == {"bar1": 1, "link": 2}
    verdict = findings.split(found, {})
    assert len(verdict["failures"]) == 1 and len(verdict["warnings"]) == 2  # link warns by default
    assert any("width x8 of x16" in w for w in verdict["warnings"])
    assert any("Gen4 of the GPU's Gen5" in w for w in verdict["warnings"])


def _fake_nvml() -> Any:
    spec = importlib.util.spec_from_file_location(
        "fake_nvml", Path(__file__).parents[1] / "gpu" / "fake_nvml.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_recorded_h200_nvml_answers_replay(tmp_path: Path) -> None:
    """The H200's recorded NVML answers, through pd_nvml_facts' own code, into the NVML checks."""
    fake = _fake_nvml()
    nvml_fake = fake.FakeNvml.recorded()
    fake.write_sysfs(tmp_path, nvml_fake.devices)
    facts = gather_gpu_facts(nvml_fake, HostProbe(sysfs_root=tmp_path, kernel_log=list))
    gpu = facts["pd_gpus"][0]
    assert (
        gpu["bar1_total_mib"] == 262144
        and gpu["pcie_width_max"] == 16
        and gpu["pcie_generation_gpu_max"] == 5
    )
    assert nvml.nvml_findings(facts["pd_gpus"], facts["pd_gpu_pcie"], "vm", [0], [0]) == []
    record = load(H200 / "nvml_fabric.json")
    assert record["devices"][0]["bar1_total"] == gpu["bar1_total_mib"] * 2**20
    assert record["p2p_status"]["0,0,write"] == {"value": 5}  # NOT_SUPPORTED for a GPU with itself


# ---- inventory ---------------------------------------------------------------------------------

ONE_HOST = {"prefill": ["gpu-node-01"], "decode": ["gpu-node-01"], "router": ["gpu-node-01"]}
TWO_HOSTS = {"prefill": ["gpu-prefill-01"], "decode": ["gpu-decode-01"], "router": ["gpu-prefill-01"]}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, 0),
        ({"serving_env_decode": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}, 1),
        ({"serving_env_common": {"PYTORCH_ALLOC_CONF": "max_split_size_mb:512,expandable_segments:true"}}, 1),
        ({"serving_env_prefill": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}}, 0),
        ({"serving_env_prefill": {"PYTORCH_CUDA_ALLOC_CONF": None}}, 0),
        (
            {
                "validation_variants": [
                    {
                        "name": "es",
                        "env_hooks": {"decode": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
                    }
                ]
            },
            1,
        ),
    ],
)
def test_expandable_segments_in_a_worker_hook_is_found(values: dict[str, Any], expected: int) -> None:
    found = inventory.inventory_findings("gpu-node-01", ONE_HOST, values)
    assert checks_of(found).get("expandable_segments", 0) == expected
    for f in found:
        assert "cuda_ipc" in f.message and "null" in f.fix


def test_router_only_hosts_are_not_checked() -> None:
    groups = dict(ONE_HOST, router=["router-01"])
    values = {"serving_env_common": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
    assert inventory.inventory_findings("router-01", groups, values) == []


def test_two_hosts_need_a_pinned_nic() -> None:
    for host in ("gpu-prefill-01", "gpu-decode-01"):
        (finding,) = inventory.inventory_findings(host, TWO_HOSTS, {"serving_ucx_net_devices": ""})
        assert finding.check == "ucx_net_devices" and "300 s" in finding.message
    assert (
        inventory.inventory_findings("gpu-prefill-01", TWO_HOSTS, {"serving_ucx_net_devices": "mlx5_0:1"})
        == []
    )
    assert inventory.inventory_findings("gpu-decode-01", TWO_HOSTS, {"serving_ib_device": "mlx5_0"}) == []
    hook = {"serving_env_host": {"UCX_NET_DEVICES": "eth1"}}
    assert inventory.inventory_findings("gpu-decode-01", TWO_HOSTS, hook) == []
    assert inventory.inventory_findings("gpu-node-01", ONE_HOST, {}) == []


def test_cli_checks_a_snapshot_and_exits_on_failures(
    healthy: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pd_appliance.fabric.__main__ import main

    path = tmp_path / "snap.json"
    path.write_text(json.dumps(apply_case(healthy, load(RTX / "broken" / "iommu-translated.json"))))
    assert main(["check", "--snapshot", str(path), "--prefill", "0,1,2,3", "--decode", "4,5,6,7"]) == 1
    assert "8 failed, 0 warned" in capsys.readouterr().out
    assert (
        main(["check", "--snapshot", str(path), "--prefill", "0", "--decode", "4", "--policy", "iommu=warn"])
        == 0
    )
