"""`python -m pd_appliance.fabric`: collect a snapshot, or check one (and NVML facts) by hand.

    python -m pd_appliance.fabric collect > snapshot.json
    python -m pd_appliance.fabric check --snapshot snapshot.json --prefill 0,1,2,3 --decode 4,5,6,7 \
        [--nvml-facts facts.json] [--policy acs=warn ...]

`check` prints one line per finding (FAIL or WARN) and exits 1 when any finding fails.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from pd_appliance.fabric import checks, collect, findings, nvml

DEFAULT_MIN_BAR1_MIB = 98304


def _indices(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pd_appliance.fabric")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("collect", help="print this host's snapshot as JSON")
    check = sub.add_parser("check", help="check a snapshot (and NVML facts)")
    check.add_argument("--snapshot", type=Path, required=True)
    check.add_argument("--nvml-facts", type=Path, help="JSON with pd_gpus and pd_gpu_pcie")
    check.add_argument("--prefill", type=_indices, default=[])
    check.add_argument("--decode", type=_indices, default=[])
    check.add_argument("--host", default=socket.gethostname())
    check.add_argument("--min-bar1-mib", type=int, default=DEFAULT_MIN_BAR1_MIB)
    check.add_argument("--policy", action="append", default=[], help="CHECK=fail|warn|skip")
    args = parser.parse_args(argv)
    if args.command == "collect":
        return collect.main([])
    policy = dict(item.split("=", 1) for item in args.policy)
    snapshot = json.loads(args.snapshot.read_text())
    found = checks.snapshot_findings(snapshot, args.host, args.prefill, args.decode, args.min_bar1_mib)
    if args.nvml_facts:
        facts = json.loads(args.nvml_facts.read_text())
        found += nvml.nvml_findings(
            facts["pd_gpus"], facts["pd_gpu_pcie"], args.host, args.prefill, args.decode
        )
    verdict = findings.split(found, policy)
    for line in verdict["failures"]:
        print(f"FAIL {line}")
    for line in verdict["warnings"]:
        print(f"WARN {line}")
    print(f"{len(verdict['failures'])} failed, {len(verdict['warnings'])} warned")
    return 1 if verdict["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
