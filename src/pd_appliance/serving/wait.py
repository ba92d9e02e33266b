"""Wait for a supervisor program to be RUNNING and healthy; fail fast when it cannot be.

    python -m pd_appliance.serving.wait --serverurl unix:///run/pd-appliance/supervisor.sock \
        --program pd:decode --url http://10.0.0.5:30001/health --log /var/log/pd-appliance/decode.log \
        [--program pd:router --url ... --log ...] [--timeout-s 1800] [--interval-s 2] [--log-lines 60]

Waits for each program in the order given (workers before the router: one process for all, where
each would cost the play a module run). Prints one JSON object ({"ok", "programs": [each result]})
and exits 0 when every program is RUNNING (past supervisor's startsecs) and its health URL answers
200. Exits 1 as soon as supervisor reports BACKOFF, FATAL, EXITED or STOPPED (a
crash during start: a missing binary, a bad flag, an out-of-memory load), or at the timeout, with
the state and the last lines of the program's log, so a broken start costs seconds, not the whole
model-load timeout. A program that answers its health URL while still STARTING is waited for: a
play that returned then would leave it to supervisor's start bookkeeping to decide its fate.
It stops at the first program that fails. With --startup-record FILE (one per --program, '' for
none), a healthy worker's log (since supervisor started it) is read for what the
engine chose at start-up and the record written to FILE (pd_appliance.serving.startup_log).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xmlrpc.client
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pd_appliance.serving.apply import connect
from pd_appliance.serving.day2 import probe
from pd_appliance.serving.polling import poll
from pd_appliance.serving.startup_log import record_program

FAILED_STATES = frozenset({"BACKOFF", "FATAL", "EXITED", "STOPPED", "UNKNOWN"})


def log_tail(path: str, lines: int) -> str:
    """The last `lines` lines of the program's log ('' when it cannot be read)."""
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines))
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"


def program_state(server: Any, program: str) -> tuple[str, str]:
    """(statename, description) of a supervisor program; ('UNKNOWN', why) when supervisor cannot say."""
    try:
        info = server.supervisor.getProcessInfo(program)
    except xmlrpc.client.Fault as fault:
        return "UNKNOWN", f"supervisor: {fault.faultString}"
    except OSError as exc:
        return "UNKNOWN", f"supervisor unreachable: {exc}"
    return str(info["statename"]), str(info.get("description", ""))


def wait(
    state: Callable[[], tuple[str, str]],
    health: Callable[[], dict[str, Any]],
    timeout_s: float,
    interval_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll until RUNNING and healthy (ok), a failed state, or the timeout; return what was seen."""

    def look() -> tuple[str, str, dict[str, Any]]:
        statename, description = state()
        return statename, description, (health() if statename in ("RUNNING", "STARTING") else {})

    def settled(seen: tuple[str, str, dict[str, Any]]) -> bool:
        return seen[0] in FAILED_STATES or (seen[0] == "RUNNING" and seen[2].get("status") == 200)

    polled = poll(look, settled, timeout_s, interval_s, clock, sleep)
    statename, description, checked = polled.seen
    result = {
        "state": statename,
        "description": description,
        "health": checked,
        "waited_s": round(polled.waited_s, 1),
    }
    if statename in FAILED_STATES:
        return {**result, "ok": False, "reason": f"supervisor reports {statename} ({description})"}
    if polled.settled:
        return {**result, "ok": True}
    seen = checked.get("status", checked.get("error", "no answer"))
    return {**result, "ok": False, "reason": f"not healthy after {timeout_s:.0f} s (health: {seen})"}


def wait_program(
    server: Any, program: str, url: str, log: str, startup_record: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Wait for one program; on success record a worker's start-up choices, on failure its log tail."""
    result = wait(
        lambda: program_state(server, program),
        lambda: probe(url, timeout_s=min(10.0, max(1.0, args.interval_s * 5))),
        args.timeout_s,
        args.interval_s,
    )
    result.update(program=program, url=url)
    if not result["ok"]:
        result["log_tail"] = log_tail(log, args.log_lines)
    elif startup_record:
        try:
            info = server.supervisor.getProcessInfo(program)
        except (xmlrpc.client.Fault, OSError):
            info = {}  # no start time: the whole log is read
        try:
            record = record_program(info, program, log, startup_record)
        except OSError as exc:  # the program is healthy: a record that cannot be written does not undo that
            record = {"error": f"cannot write {startup_record}: {exc.strerror}"}
        result["startup"] = {k: record.get(k) for k in ("choices", "fallbacks", "error")}
    return result


def wait_arguments(
    program: str, health_urls: dict[str, str], log_dir: str, startup_dir: str = "", group: str = "pd"
) -> list[str]:
    """One program's arguments of this command, as the roles' wait tasks pass them: the pd group's
    logs are <log_dir>/<program>.log and a worker's start-up record goes to startup_dir (the router
    has none); another group's (monitor) logs are <log_dir>/<group>-<program>.log, with no record."""
    log = f"{log_dir}/{program}.log" if group == "pd" else f"{log_dir}/{group}-{program}.log"
    record = f"{startup_dir}/{program}.json" if startup_dir and group == "pd" and program != "router" else ""
    return [f"--program={group}:{program}", f"--url={health_urls[program]}", f"--log={log}",
            f"--startup-record={record}"]  # fmt: skip


def run(argv: Sequence[str] | None = None) -> tuple[int, dict[str, Any]]:
    """Parse the arguments, wait for each program in order; the exit status and the JSON result."""
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.serving.wait", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--serverurl", required=True)
    parser.add_argument("--program", required=True, action="append", help="group:name, e.g. pd:decode")
    parser.add_argument("--url", required=True, action="append", help="health URL that must answer 200")
    parser.add_argument("--log", required=True, action="append", help="the program's log file")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per program")
    parser.add_argument("--interval-s", type=float, default=2.0)
    parser.add_argument("--log-lines", type=int, default=60)
    parser.add_argument("--startup-record", action="append", default=None,
                        help="once healthy, write what the engine chose at start-up (read from --log since "
                        "the program started) to this JSON file; '' for none (the router)")  # fmt: skip
    args = parser.parse_args(argv)
    records = args.startup_record or [""] * len(args.program)
    if not len(args.program) == len(args.url) == len(args.log) == len(records):
        parser.error("give --url, --log (and --startup-record, when any) once for each --program")
    server = connect(args.serverurl)
    results = []
    for program, url, log, record in zip(args.program, args.url, args.log, records, strict=True):
        results.append(wait_program(server, program, url, log, record, args))
        if not results[-1]["ok"]:
            break
    ok = all(result["ok"] for result in results)
    return (0 if ok else 1), {"ok": ok, "programs": results}


def main(argv: Sequence[str] | None = None) -> int:
    rc, result = run(argv)
    print(json.dumps(result))
    return rc


if __name__ == "__main__":
    sys.exit(main())
