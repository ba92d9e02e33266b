"""Fabric checks on the NVML facts (pd_gpus, pd_gpu_pcie), once the driver is in.

They read the facts the pd_nvml_facts module sets, so a rehearsal host (pd_gpus from its declared GPU
stand-in) goes through the same checks with the answers its stand-in declares. NVML's P2P status
alone proves nothing (ForceP2P registry keys can make the driver advertise P2P while every mapping
fails); the NIXL check's real transfer is the proof, these catch what NVML already admits. A pair
without P2P across sockets is judged by figures, not by rule: its finding names the KV rate the NIXL
check will require (pd_appliance.fabric.kv_need).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pd_appliance.fabric.findings import Finding
from pd_appliance.fabric.kv_need import KvNeed

P2P_FIX = (
    "P2P between these GPUs must be OK in `nvidia-smi topo -p2p w`: turn the IOMMU to passthrough "
    "(iommu=pt) and ACS off (see the preflight fabric checks), enable P2P / xGMI peer settings in the "
    "BIOS, remove any P2P-disabling driver registry key (NVreg_RegistryDwords), or place prefill and "
    "decode on GPUs that can reach each other (serving_prefill_gpus, serving_decode_gpus)"
)
BAR1_FIX = (
    "enable 'Above 4G Decoding' and 'Re-Size BAR Support' in the BIOS; `nvidia-smi -q -d MEMORY` must "
    "show a BAR1 total at least the GPU's memory"
)
LINK_FIX = (
    "reseat the GPU or its riser, move it to a slot wired for the GPU's full width and generation, and "
    "check the BIOS PCIe speed setting; `nvidia-smi -q | grep -A12 'GPU Link Info'` shows the link"
)


def _gpu(gpus: Iterable[Mapping[str, Any]], index: int) -> Mapping[str, Any] | None:
    return next((g for g in gpus if int(g.get("index", -1)) == index), None)


CROSS_SOCKET_FIX = (
    "nothing to do here if the NIXL check passes: it measures the first prefill -> first decode pair "
    "(nixl_check_src_gpu / nixl_check_dst_gpu) and fails unless the host-staged path covers the KV need x "
    "appliance_kv_margin. To give each pair P2P instead, keep every prefill -> decode pair on one socket "
    "(docs/fabric.md: e.g. 2P TP2 + 2D TP2 with one prefill/decode couple per socket), or enable "
    "cross-socket P2P in the BIOS where the platform supports it"
)
# nvidia-smi topo -m: SYS = "PCIe as well as the SMP interconnect between NUMA nodes (QPI/UPI)".
CROSS_SOCKET_LINKS = ("SYS",)
# NVML P2P answers that say the platform cannot do P2P on that path (pd_appliance.gpu.pcie
# names them). DISABLED_BY_REGKEY (someone turned it off) and UNKNOWN stay `p2p` findings.
PLATFORM_P2P_GAPS = (
    "CHIPSET_NOT_SUPPORTED",
    "IOH_TOPOLOGY_NOT_SUPPORTED",
    "GPU_NOT_SUPPORTED",
    "NOT_SUPPORTED",
)


def _cell(matrix: Any, i: int, j: int) -> str:
    return str(matrix[i][j]) if matrix and i < len(matrix) and j < len(matrix[i]) else "UNKNOWN"


def cross_socket(
    topology: Mapping[str, Any], gpus: Iterable[Mapping[str, Any]], first: int, second: int
) -> bool:
    """Whether two GPUs sit on different sockets: link SYS, or different NUMA nodes in the facts."""
    order = [int(i) for i in topology.get("gpus", [])]
    if first in order and second in order:
        link = _cell(topology.get("link"), order.index(first), order.index(second))
        if link in CROSS_SOCKET_LINKS:
            return True
    nodes = [(_gpu(gpus, index) or {}).get("numa_node") for index in (first, second)]
    known = [int(n) for n in nodes if n is not None and int(n) >= 0]
    return len(known) == 2 and known[0] != known[1]


def _need_words(need: KvNeed | None) -> str:
    if need is None:
        return (
            "the NIXL check measures the host-staged path; with no KV need known "
            "(appliance_kv_bytes_per_token, validation_target_output_tok_s) it fails that path unless "
            "nixl_check_min_bandwidth_gb_s sets a floor"
        )
    return (
        f"the NIXL check will require the measured path to carry {need.required_gb_s:.4g} GB/s "
        f"(need {need.need_gb_s:.4g} GB/s per TP rank pair x margin {need.margin:g}; {need.basis()})"
    )


def p2p_findings(
    topology: Mapping[str, Any],
    host: str,
    prefill: list[int],
    decode: list[int],
    gpus: Iterable[Mapping[str, Any]] = (),
    need: KvNeed | None = None,
) -> list[Finding]:
    """Prefill -> decode pairs whose NVML P2P write status is not OK (SGLang's NIXL path writes).

    A pair on one socket without P2P, or any pair whose P2P a registry key disabled, is check `p2p`
    (a BIOS, ACS or driver-setting problem on a path that should have it). A pair across sockets
    that the platform cannot give P2P (CHIPSET_NOT_SUPPORTED and the like) is `p2p_cross_socket`:
    many dual-socket platforms (AMD Genoa among them) have no P2P between sockets, KV is then
    staged through host memory, and whether that is fast enough is a matter of figures: the
    finding names the KV rate `need` that the NIXL check will hold the measured path to.
    """
    order = [int(i) for i in topology.get("gpus", [])]
    matrix = topology.get("p2p_write") or []
    reads = topology.get("p2p_read") or []
    gpus = list(gpus)
    found = []
    for p in prefill:
        for d in decode:
            if p == d or p not in order or d not in order:
                continue
            i, j = order.index(p), order.index(d)
            status = _cell(matrix, i, j)
            if status == "OK":
                continue
            read = _cell(reads, i, j)
            link = _cell(topology.get("link"), i, j) if topology.get("link") else "?"
            subject = f"GPU {p} (prefill) -> GPU {d} (decode)"
            if status in PLATFORM_P2P_GAPS and cross_socket(topology, gpus, p, d):
                found.append(
                    Finding(
                        "p2p_cross_socket",
                        host,
                        subject,
                        f"NVML reports P2P write {status} (read {read}, link {link}): the GPUs are on "
                        f"different sockets, so KV is staged through host memory; {_need_words(need)}.",
                        CROSS_SOCKET_FIX,
                    )
                )
                continue
            found.append(
                Finding(
                    "p2p",
                    host,
                    subject,
                    f"NVML reports P2P write {status} (read {read}, link {link}): UCX cannot use cuda_ipc "
                    "between them, so every KV transfer is staged through host memory.",
                    P2P_FIX,
                )
            )
    return found


def bar1_findings(gpus: Iterable[Mapping[str, Any]], host: str, chosen: Iterable[int]) -> list[Finding]:
    """GPUs whose BAR1 (NVML) is smaller than their memory: peers cannot map all of it."""
    found = []
    for index in chosen:
        gpu = _gpu(gpus, index)
        if gpu is None or gpu.get("bar1_total_mib") is None:
            continue
        bar1, memory = int(gpu["bar1_total_mib"]), int(gpu.get("memory_total_mib") or 0)
        if bar1 >= memory:
            continue
        found.append(
            Finding(
                "bar1",
                host,
                f"GPU {index} ({gpu.get('pci_bus_id')})",
                f"NVML reports BAR1 {bar1} MiB for {memory} MiB of memory: resizable BAR is off, peers "
                "cannot map the GPU's memory and P2P is crippled.",
                BAR1_FIX,
            )
        )
    return found


def link_findings(gpus: Iterable[Mapping[str, Any]], host: str, chosen: Iterable[int]) -> list[Finding]:
    """Links trained below their width, or slots below the GPU's generation.

    An idle link lowers its generation to save power, so the current generation is judged only
    under load (the NIXL check); here the width (which does not drop at idle) and the slot's
    maximum generation against the GPU's own.
    """
    found = []
    for index in chosen:
        gpu = _gpu(gpus, index)
        if gpu is None:
            continue
        width, width_max = gpu.get("pcie_width"), gpu.get("pcie_width_max")
        gen, gen_gpu = gpu.get("pcie_generation"), gpu.get("pcie_generation_gpu_max")
        short = []
        if width is not None and width_max is not None and int(width) < int(width_max):
            short.append(f"width x{width} of x{width_max}")
        if gen is not None and gen_gpu is not None and int(gen) < int(gen_gpu):
            short.append(f"the slot allows Gen{gen} of the GPU's Gen{gen_gpu}")
        if short:
            found.append(
                Finding(
                    "link",
                    host,
                    f"GPU {index} ({gpu.get('pci_bus_id')})",
                    f"PCIe link: {' and '.join(short)}; KV transfers and host copies run slower.",
                    LINK_FIX,
                )
            )
    return found


def probe_pair(gpus: Iterable[Mapping[str, Any]], prefill: list[int], decode: list[int]) -> tuple[int, int]:
    """The prefill -> decode pair the NIXL check should measure: the worst one this host can form.

    The first pair whose GPUs sit on different NUMA nodes (across sockets: no P2P on many
    platforms, KV staged through host memory), else the first prefill GPU to the first decode GPU.
    A host with one role measures its first GPU to itself (the two-host case's local half).
    """
    if not prefill or not decode:
        first = (prefill or decode or [0])[0]
        return first, first
    nodes = {int(g.get("index", -1)): g.get("numa_node") for g in gpus}
    for p in prefill:
        for d in decode:
            a, b = nodes.get(p), nodes.get(d)
            if p != d and a is not None and b is not None and int(a) >= 0 and int(b) >= 0 and a != b:
                return p, d
    return prefill[0], decode[0]


def nvml_findings(
    gpus: list[Mapping[str, Any]],
    topology: Mapping[str, Any],
    host: str,
    prefill: list[int],
    decode: list[int],
    need: KvNeed | None = None,
) -> list[Finding]:
    """Every NVML-side fabric finding for the host's PD GPUs (`need`: the KV rate, for P2P findings)."""
    chosen = sorted(set(prefill) | set(decode))
    return (
        p2p_findings(topology, host, prefill, decode, gpus, need)
        + bar1_findings(gpus, host, chosen)
        + link_findings(gpus, host, chosen)
    )
