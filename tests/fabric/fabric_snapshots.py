"""Snapshots for tests/fabric: the composed healthy 8-GPU host, its broken variants, the H200 record;
and the model and target line the KV-need figures are computed from."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from pd_testlib import DSV4_TEST_CONFIG

FIXTURES = Path(__file__).parent / "fixtures"
RTX = FIXTURES / "rtxpro6000-8gpu"
H200 = FIXTURES / "h200-2026-12-03"
CASES = sorted(p.stem for p in (RTX / "broken").glob("*.json"))
ACS_REDIRECT = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
CONFIG = DSV4_TEST_CONFIG
# The lab's target line and request shape (inventory/lab/group_vars/all/validation.yml).
LAB_TARGETS = {1: 210, 16: 1000}
LAB_INPUT, LAB_OUTPUT = 1024, 128
_HEADER = re.compile(r"^(?=[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] )", re.MULTILINE)


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def _blocks(text: str) -> dict[str, str]:
    return {block.split(" ", 1)[0]: block for block in _HEADER.split(text) if block.strip()}


def _edit_blocks(snapshot: dict[str, Any], addresses: list[str], edit: Any) -> None:
    blocks = _blocks(snapshot["lspci"])
    for address in addresses:
        blocks[address] = edit(blocks[address])
    snapshot["lspci"] = "".join(blocks[a] for a in sorted(blocks))


def apply_case(healthy: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    """The healthy snapshot with one broken case's changes (see fixtures/rtxpro6000-8gpu/broken)."""
    snap = copy.deepcopy(healthy)
    for key in ("cmdline", "modprobe", "lspci", "lspci_error"):
        if key in case:
            snap[key] = case[key]
    snap["sysfs"].update(case.get("set_sysfs", {}))
    if case.get("acs_on"):
        _edit_blocks(snap, case["acs_on"], lambda b: re.sub(r"ACSCtl:\t.*", f"ACSCtl:\t{ACS_REDIRECT}", b))
    if case.get("aspm_l1"):
        _edit_blocks(snap, case["aspm_l1"], lambda b: b.replace("ASPM Disabled;", "ASPM L1 Enabled;"))
    for gpu in case.get("bar1_256m", []):
        rel = f"bus/pci/devices/{gpu}/resource"
        lines = snap["sysfs"][rel].splitlines()
        start = int(lines[1].split()[0], 16)
        lines[1] = f"0x{start:016x} 0x{start + 256 * 2**20 - 1:016x} 0x000000000014220c"
        snap["sysfs"][rel] = "\n".join(lines)
        _edit_blocks(
            snap,
            [gpu],
            lambda b: b.replace("[size=128G]", "[size=256M]").replace(
                "current size: 128GB", "current size: 256MB"
            ),
        )
    if case.get("access_denied"):
        _edit_blocks(
            snap,
            sorted(_blocks(snap["lspci"])),
            lambda b: b.split("\tCapabilities:", 1)[0] + "\tCapabilities: <access denied>\n",
        )
    return snap
