"""Apply rendered supervisor config: restart exactly the programs whose config changed.

    python -m pd_appliance.serving.apply --serverurl unix:///run/pd-appliance/supervisor.sock \
        [--group pd] [--restart decode ...] [--wait --program monitor:x --url ... --log ...]

`--restart` names programs to restart although their section did not change (their env file
did: secrets live there, not in the section). Workers are applied before the router (priority
order). Prints one JSON object: {"changed": bool, "actions": {"pd:decode": "restarted", ...}}.
With --wait, the rest of the arguments go to pd_appliance.serving.wait (same --serverurl), run once
the group is applied, in the same process (a play's module run less); its result is "wait" and its
exit status this one's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xmlrpc.client
from collections.abc import Callable, Sequence
from typing import Any

from supervisor.xmlrpc import Faults, SupervisorTransport

RUNNING_STATES = {"STARTING", "RUNNING", "BACKOFF", "STOPPING"}


def connect(serverurl: str, username: str | None = None, password: str | None = None) -> Any:
    """An XML-RPC proxy to supervisord (unix:// or http:// serverurl)."""
    transport = SupervisorTransport(username, password, serverurl)
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def stop_program(server: Any, full_name: str) -> None:
    """Stop `group:name` and wait for it (supervisor's stopProcess); one already stopped is fine."""
    _unless(Faults.NOT_RUNNING, server.supervisor.stopProcess, full_name, True)


def start_program(server: Any, full_name: str) -> None:
    """Start `group:name` without waiting for its start window; one already running is fine."""
    _unless(Faults.ALREADY_STARTED, server.supervisor.startProcess, full_name, False)


def _unless(already: int, call: Any, *args: Any) -> None:
    """`call(*args)` over XML-RPC, where the fault `already` means what was asked is already so."""
    try:
        call(*args)
    except xmlrpc.client.Fault as fault:
        if fault.faultCode != already:
            raise


def apply(
    server: Any, group: str = "pd", restart: Sequence[str] = (), log: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """Reload the config files and bring the group's programs in line, one program at a time."""
    added, changed, removed = server.supervisor.reloadConfig()[0]
    actions: dict[str, str] = {}
    if group in removed:
        server.supervisor.stopProcessGroup(group, True)
        server.supervisor.removeProcessGroup(group)
        actions[group] = "removed group"
        return {"changed": True, "actions": actions}
    if group in added:
        server.supervisor.addProcessGroup(group)
        for info in server.supervisor.getAllProcessInfo():
            if info["group"] == group:
                actions[f"{group}:{info['name']}"] = "added"
        return {"changed": True, "actions": actions}
    active = {i["name"]: i for i in server.supervisor.getAllProcessInfo() if i["group"] == group}
    diff = (
        server.pd_appliance.diffProcesses(group)
        if group in changed
        else {"added": [], "changed": [], "removed": []}
    )
    for name in diff["removed"]:
        stop_program(server, f"{group}:{name}")
        server.pd_appliance.removeProcess(group, name)
        actions[f"{group}:{name}"] = "removed"
    # Changed and added programs together in priority order (a new instance starts before the router
    # that routes to it); a supervisord started before "order" existed gives changed, then added.
    todo = set(diff["changed"]) | set(diff["added"])
    order = [n for n in diff.get("order") or diff["changed"] + diff["added"] if n in todo]
    for name in order:
        full = f"{group}:{name}"
        was_running = active.get(name, {}).get("statename") in RUNNING_STATES
        if name in diff["added"]:
            log(f"{full}: new program, starting")
        else:
            log(f"{full}: config changed, restarting")
            stop_program(server, full)
        server.pd_appliance.replaceProcess(group, name)
        if was_running or name in diff["added"]:
            time.sleep(0.2)  # autostart programs are spawned by supervisord's own loop
            if server.supervisor.getProcessInfo(full)["statename"] not in RUNNING_STATES:
                start_program(server, full)
        actions[full] = "added" if name in diff["added"] else "restarted"
    for name in restart:
        full = f"{group}:{name}"
        if full in actions or name not in active:
            continue
        log(f"{full}: env file changed, restarting")
        stop_program(server, full)
        start_program(server, full)
        actions[full] = "restarted"
    return {"changed": bool(actions), "actions": actions}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pd_appliance.serving.apply", description=__doc__.split("\n")[0]
    )
    p.add_argument("--serverurl", required=True)
    p.add_argument("--group", default="pd")
    p.add_argument("--restart", nargs="*", default=[])
    p.add_argument("--wait", nargs=argparse.REMAINDER, default=None,
                   help="then wait: pd_appliance.serving.wait's arguments, without --serverurl")  # fmt: skip
    args = p.parse_args(argv)
    server = connect(args.serverurl)
    try:
        result = apply(server, args.group, args.restart, log=lambda m: print(m, file=sys.stderr))
    except (xmlrpc.client.Fault, OSError) as exc:
        print(
            json.dumps({"changed": False, "failed": True, "msg": f"supervisord at {args.serverurl}: {exc}"})
        )
        return 1
    rc = 0
    if args.wait is not None:
        from pd_appliance.serving import wait  # imports this module

        rc, result["wait"] = wait.run(["--serverurl", args.serverurl, *args.wait])
    print(json.dumps(result))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
