"""Fabric readiness: the PCIe, P2P and NIXL failures that stall PD, caught before they cost a day.

- collect: a snapshot of the host's PCI fabric without any driver (runs on the host, stdlib only);
- checks: IOMMU, ACS, BAR1, HMM and ASPM findings from a snapshot (the preflight stage runs them);
- nvml: P2P, BAR1 and link findings from the NVML facts (pd_gpus, pd_gpu_pcie);
- inventory: expandable_segments in a worker env hook, UCX_NET_DEVICES for two hosts;
- findings: the Finding type and the policy (fail, warn or skip per check).
- kv_need: the KV rate a prefill -> decode rank pair must carry at the target line, from the
  model (pd_appliance.model) and validation_target_output_tok_s; what a path without P2P is judged by.

The NIXL transfer check is pd_appliance.nixl_check (it runs in the SGLang venv); docs/fabric.md
says how the pieces fit.
"""

from pd_appliance.fabric.findings import CHECKS, SEVERITIES, Finding, split

__all__ = ["CHECKS", "SEVERITIES", "Finding", "split"]
