"""Fabric readiness filters: thin wrappers over pd_appliance.fabric (see that package for the checks).

Each returns {"failures": [...], "warnings": [...]}: sentences naming host, what was found and the
fix, every check at the severity its role variable gives (fail, warn or skip).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    import pd_appliance  # noqa: F401
except ImportError:  # pragma: no cover - depends on how ansible-playbook was installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from pd_appliance.fabric import findings, inventory, nvml, preflight


def _indices(values: Any) -> list[int]:
    return [int(v) for v in values or []]


def pd_fabric_preflight(
    snapshot: dict[str, Any],
    host: str,
    prefill: Any,
    decode: Any,
    min_bar1_mib: Any,
    policy: dict[str, Any],
) -> dict[str, list[str]]:
    """The no-driver checks (iommu, acs, bar1, uvm_hmm, aspm) on a collected snapshot."""
    found = preflight.preflight_findings(
        snapshot, host, _indices(prefill), _indices(decode), int(min_bar1_mib)
    )
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
) -> dict[str, list[str]]:
    """P2P status per prefill -> decode pair, BAR1 and link width/generation from the NVML facts."""
    found = nvml.nvml_findings(gpus, topology, host, _indices(prefill), _indices(decode))
    return findings.split(found, policy)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_fabric_preflight": pd_fabric_preflight,
            "pd_fabric_inventory": pd_fabric_inventory,
            "pd_fabric_nvml": pd_fabric_nvml,
        }
