"""Open a TCP connection to each name=host:port target; report every one that fails.

    python -m pd_appliance.serving.reach --timeout-s 5 pd:decode@gpu-2=10.0.0.6:30001 ...

Run on a router host after serve: the router dials every worker at its advertised address, and
decode dials prefill's bootstrap port, so a bind/advertise mismatch or a firewall shows here, naming
the pair, before the first request gets a 502. Prints JSON {"ok": bool, "failed": [...], "ok_targets": [...]}.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def parse_target(spec: str) -> tuple[str, str, int]:
    """`name=host:port` (IPv6 in brackets) -> (name, host, port)."""
    name, sep, address = spec.rpartition("=")
    host, _, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"target {spec!r}: expected NAME=HOST:PORT")
    return name, host.strip("[]"), int(port)


def try_connect(host: str, port: int, timeout_s: float) -> str | None:
    """None when a TCP connection opens, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def reach(targets: Iterable[tuple[str, str, int]], timeout_s: float) -> dict[str, Any]:
    failed: list[dict[str, Any]] = []
    reached: list[dict[str, Any]] = []
    for name, host, port in targets:
        error = try_connect(host, port, timeout_s)
        entry = {"name": name, "address": f"{host}:{port}"}
        (failed if error else reached).append({**entry, "error": error} if error else entry)
    return {"ok": not failed, "failed": failed, "ok_targets": reached}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.serving.reach", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("targets", nargs="+", metavar="NAME=HOST:PORT")
    args = parser.parse_args(argv)
    try:
        targets = [parse_target(t) for t in args.targets]
    except ValueError as exc:
        parser.error(str(exc))
    result = reach(targets, args.timeout_s)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
