"""A finding: one check's verdict about one thing, with the sentence an operator acts on.

Every fabric check returns findings; a policy (one severity per check, from the role variables)
turns them into failures, warnings or nothing. The defaults fail where PD cannot work (a P2P path
that hangs, KV that falls back to TCP) and warn where it works worse. A pair without P2P across
sockets is a warning here: whether its host-staged path is fast enough depends on the KV rate the
model and the target line need, which the NIXL check measures against (pd_appliance.fabric.kv_need).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

SEVERITIES = ("fail", "warn", "skip")

# Each check, what it protects against, and its default severity (the role defaults repeat these).
CHECKS: dict[str, tuple[str, str]] = {
    "iommu": ("fail", "IOMMU translating GPU DMA: P2P and NCCL hang"),
    "acs": ("fail", "ACS redirect on a bridge between GPUs: P2P hangs or detours through the CPU"),
    "bar1": ("fail", "BAR1 smaller than GPU memory: peers cannot map it, P2P is crippled"),
    "uvm_hmm": ("warn", "HMM in nvidia_uvm: CUDA init fails on some kernels (CUDA 13 notes)"),
    "aspm": ("warn", "PCIe ASPM on a GPU link: 'surprise link down' lock-ups"),
    "p2p": ("fail", "NVML P2P not OK for a prefill -> decode pair on one socket: KV staged via host"),
    "p2p_cross_socket": ("warn", "no P2P for a pair across sockets: the NIXL check judges it by the KV need"),
    "link": ("warn", "PCIe link below its generation or width"),
    "expandable_segments": ("fail", "expandable_segments memory cannot use cuda_ipc: NIXL drops to TCP"),
    "ucx_net_devices": ("fail", "two hosts without UCX_NET_DEVICES: NIXL hangs to its 300 s timeout"),
}


@dataclass(frozen=True)
class Finding:
    """One problem found by `check` on `host` about `subject` (a GPU, a bridge, a variable)."""

    check: str
    host: str
    subject: str
    message: str
    fix: str

    def sentence(self) -> str:
        """The line shown to the operator: where, what, and what to do."""
        return f"{self.host}: [{self.check}] {self.subject}: {self.message} Fix: {self.fix}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def severity_errors(policy: Mapping[str, Any]) -> list[str]:
    """Policy values that are not fail/warn/skip, or name no known check."""
    errors = []
    for check, value in policy.items():
        if check not in CHECKS:
            errors.append(f"unknown fabric check {check!r} (known: {', '.join(CHECKS)})")
        elif value not in SEVERITIES:
            errors.append(f"fabric check {check}: severity {value!r} is not one of {', '.join(SEVERITIES)}")
    return errors


def split(findings: Iterable[Finding], policy: Mapping[str, Any]) -> dict[str, list[str]]:
    """{"failures": [...], "warnings": [...]} as sentences, each check at its policy's severity.

    A check missing from `policy` takes its default from CHECKS.
    """
    errors = severity_errors(policy)
    if errors:
        raise ValueError("; ".join(errors))
    out: dict[str, list[str]] = {"failures": [], "warnings": []}
    for finding in findings:
        level = policy.get(finding.check, CHECKS[finding.check][0])
        if level == "fail":
            out["failures"].append(finding.sentence())
        elif level == "warn":
            out["warnings"].append(finding.sentence())
    return out
