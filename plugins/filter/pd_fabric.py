"""Fabric readiness filters: thin wrappers over pd_appliance.fabric (see that package for the checks).

Each returns {"failures": [...], "warnings": [...]}: sentences naming host, what was found and the
fix, every check at the severity its role variable gives (fail, warn or skip).
"""

from __future__ import annotations

from typing import Any

from pd_appliance.fabric import checks, findings, inventory, kv_need, nvml


def _indices(values: Any) -> list[int]:
    return [int(v) for v in values or []]


def pd_fabric_snapshot_findings(
    snapshot: dict[str, Any],
    host: str,
    prefill: Any,
    decode: Any,
    min_bar1_mib: Any,
    policy: dict[str, Any],
) -> dict[str, list[str]]:
    """The no-driver checks (iommu, acs, bar1, uvm_hmm, aspm) on a collected snapshot."""
    found = checks.snapshot_findings(snapshot, host, _indices(prefill), _indices(decode), int(min_bar1_mib))
    return findings.split(found, policy)


def pd_fabric_inventory(
    values: dict[str, Any], host: str, groups: dict[str, Any], policy: dict[str, Any]
) -> dict[str, list[str]]:
    """expandable_segments in a worker env hook; UCX_NET_DEVICES for a two-host layout."""
    return findings.split(inventory.inventory_findings(host, groups, values), policy)


def pd_fabric_nvml(
    gpus: list[dict[str, Any]],
    topology: dict[str, Any],
    host: str,
    prefill: Any,
    decode: Any,
    policy: dict[str, Any],
    need: dict[str, Any] | None = None,
) -> dict[str, list[str]]:
    """P2P status per prefill -> decode pair, BAR1 and link width/generation from the NVML facts.

    `need` is pd_kv_need's answer: a cross-socket pair's finding names the figure the NIXL check
    will require of the host-staged path.
    """
    found = nvml.nvml_findings(
        gpus, topology, host, _indices(prefill), _indices(decode), kv_need.KvNeed.from_dict(need)
    )
    return findings.split(found, policy)


def pd_kv_need(
    config: dict[str, Any] | None,
    kv_bytes_per_token: Any,
    targets: Any,
    input_len: Any,
    output_len: Any,
    margin: Any,
) -> dict[str, Any]:
    """The KV rate one prefill -> decode rank pair needs at the target line, with its figures.

    `config` is the checkpoint's config.json ({} where the host has none yet); an explicit
    `kv_bytes_per_token` wins over it. {"error": why} when it cannot be computed: the NIXL check
    then judges a host-staged path only by an explicit floor, and fails it without one.
    """
    try:
        need = kv_need.need_for_deployment(
            config, kv_bytes_per_token, targets or {}, input_len, output_len, margin
        )
    except ValueError as err:
        return {"error": str(err)}
    return need.as_dict()


def pd_fabric_p2p_ok(topology: dict[str, Any] | None, first: Any, second: Any) -> bool:
    """Whether NVML reports P2P write OK from GPU `first` to GPU `second` (a GPU with itself: True)."""
    if int(first) == int(second):
        return True
    order = [int(i) for i in (topology or {}).get("gpus", [])]
    if int(first) not in order or int(second) not in order:
        return False
    matrix = (topology or {}).get("p2p_write") or []
    i, j = order.index(int(first)), order.index(int(second))
    return i < len(matrix) and j < len(matrix[i]) and matrix[i][j] == "OK"


def pd_fabric_role_gpus(instances: Any, role: str) -> list[int]:
    """GPUs of this host's serving instances of `role` (serving_instances, per-role layout included)."""
    return inventory.role_gpus(instances, role)


def pd_fabric_probe_pair(gpus: Any, prefill: Any, decode: Any) -> list[int]:
    """[src, dst] for the NIXL check: the first pair across NUMA nodes, else first -> first."""
    return list(nvml.probe_pair(gpus or [], _indices(prefill), _indices(decode)))


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_fabric_snapshot_findings": pd_fabric_snapshot_findings,
            "pd_fabric_inventory": pd_fabric_inventory,
            "pd_fabric_nvml": pd_fabric_nvml,
            "pd_kv_need": pd_kv_need,
            "pd_fabric_p2p_ok": pd_fabric_p2p_ok,
            "pd_fabric_role_gpus": pd_fabric_role_gpus,
            "pd_fabric_probe_pair": pd_fabric_probe_pair,
        }
