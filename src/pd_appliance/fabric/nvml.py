"""Fabric checks on the NVML facts (pd_gpus, pd_gpu_topology), once the driver is in.

They read the facts the nvml_facts module sets, so a simulated host (pd_gpus entries marked
"simulated": true, from the simulated-GPU stand-in) goes through the same checks with the answers
its stand-in declares. NVML's P2P status alone proves nothing (ForceP2P registry keys can make the
driver advertise P2P while every mapping fails); the NIXL check's real transfer is the proof, these
catch what NVML already admits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pd_appliance.fabric.findings import Finding

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


def p2p_findings(
    topology: Mapping[str, Any], host: str, prefill: list[int], decode: list[int]
) -> list[Finding]:
    """Prefill -> decode pairs whose NVML P2P write status is not OK (SGLang's NIXL path writes)."""
    order = [int(i) for i in topology.get("gpus", [])]
    matrix = topology.get("p2p_write") or []
    reads = topology.get("p2p_read") or []
    found = []
    for p in prefill:
        for d in decode:
            if p == d or p not in order or d not in order:
                continue
            i, j = order.index(p), order.index(d)
            status = matrix[i][j] if i < len(matrix) and j < len(matrix[i]) else "UNKNOWN"
            if status == "OK":
                continue
            read = reads[i][j] if i < len(reads) and j < len(reads[i]) else "UNKNOWN"
            link = (topology.get("link") or [[]])[i][j] if topology.get("link") else "?"
            found.append(
                Finding(
                    "p2p",
                    host,
                    f"GPU {p} (prefill) -> GPU {d} (decode)",
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


def nvml_findings(
    gpus: list[Mapping[str, Any]],
    topology: Mapping[str, Any],
    host: str,
    prefill: list[int],
    decode: list[int],
) -> list[Finding]:
    """Every NVML-side fabric finding for the host's PD GPUs."""
    chosen = sorted(set(prefill) | set(decode))
    return (
        p2p_findings(topology, host, prefill, decode)
        + bar1_findings(gpus, host, chosen)
        + link_findings(gpus, host, chosen)
    )
