"""smg's discovery file: the router's workers, written by the play, read live by smg.

smg 1.13 `--discovery-provider file --discovery-file F` (docs/fleet.md, "Discovery by file", measured
against the real binary): F is `{"version": 1, "workers": [{"url", "worker_type", "bootstrap_port"}]}`
(smg's model_gateway/src/service_discovery/file.rs refuses a manifest without `version` and any
field it does not know, an `api_key` included: the router's own --api-key is what it sends to these
workers). smg rereads the file as soon as it changes and every --discovery-check-interval-secs,
adds a listed worker once it answers, drains and forgets one no longer listed (its 5 s settle),
keeps the last good manifest when a new one is invalid, and reads the file again at every start.
So the file is the router's start-up list and its live list in one: a fleet change is a rewrite
of this file, not a restart of smg.

After a play, `check` asks smg (GET /workers) until what it has registered equals the file, and
names the difference when it does not within the bound.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pd_appliance.files import write_atomic
from pd_appliance.serving import commands, fleet
from pd_appliance.serving.polling import poll

MANIFEST_VERSION = 1


def manifest(instances: Sequence[Mapping[str, Any]], out: Sequence[str] = ()) -> dict[str, Any]:
    """The discovery file for every published instance of the deployment (pd_serving_topology's
    form: role, url, bootstrap_port, host) but those of the hosts in `out` (out of rotation),
    checked as the router's command line was: one mode, at least one prefill and one decode in PD
    mode, a bootstrap port on every prefill (commands.router_workers)."""
    left = [i for i in instances if i.get("host") not in set(out)]
    by_role = {role: [i for i in left if i["role"] == role] for role in commands.WORKER_ROLES}
    try:
        _, workers = commands.router_workers(by_role["prefill"], by_role["decode"], by_role["aggregated"])
    except commands.CommandError as exc:
        if not out:
            raise
        raise commands.CommandError(
            f"with {', '.join(out)} out of rotation: {exc}. Put a host back first "
            "(playbooks/day2/drain.yml -e state=in) or add one"
        ) from exc
    return {"version": MANIFEST_VERSION, "workers": workers}


def out_of_rotation(states: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """The hosts whose host state (ansible_local.pd_appliance, by host) says `fleet.rotation: out`."""
    return [
        host for host, state in states.items() if ((state or {}).get("fleet") or {}).get("rotation") == "out"
    ]


def listed_before(read: Mapping[str, Any] | None, exists: bool) -> dict[str, Any] | None:
    """The discovery file as the play found it on the router host, from the role's single host read
    (pd_host_read: `content` base64 when it could read the file); None when there is no file yet (a
    first deploy). A file that exists but could not be read is an error: taking it for a first
    deploy would let a joining host into the fleet ungated."""
    content = (read or {}).get("content")
    if content is None:
        if exists:
            raise ValueError(
                f"smg's discovery file {(read or {}).get('source')} exists but could not be read: run the "
                "play as a user that can read it (become), so the hosts joining the fleet are known"
            )
        return None
    listed: dict[str, Any] = json.loads(base64.b64decode(content))
    return listed


def _hosts(instances: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(i.get("host")) for i in instances))


def joining(
    instances: Sequence[Mapping[str, Any]], listed: Mapping[str, Any] | None, out: Sequence[str] = ()
) -> list[str]:
    """The hosts joining the fleet (issue 27's add path): none of their instances is in the discovery
    file as it stood before the play (`listed`), and they are not out of rotation (`out`: drained or
    retired). A missing file (None) is a first deploy: nobody joins, the validate stage gates the
    whole deployment."""
    if listed is None:
        return []
    in_file = {str(w["url"]) for w in listed.get("workers") or []}
    found = []
    for host in _hosts(instances):
        urls = {str(i["url"]) for i in instances if str(i.get("host")) == host}
        if host not in set(out) and not urls & in_file:
            found.append(host)
    return found


def companions(
    instances: Sequence[Mapping[str, Any]], listed: Mapping[str, Any] | None, hosts: Sequence[str]
) -> list[dict[str, Any]]:
    """What the gate of `hosts` borrows (pd_appliance.serving.host_gate): for each PD role their
    instances lack, the first instance of that role in rotation (listed in `listed`, of another
    host; on an add it serves the same release). [] when the hosts hold both roles (or aggregated
    ones), or when the file lists none of the missing role: the gate then names what is missing."""
    own = [i for i in instances if str(i.get("host")) in set(hosts)]
    roles = {str(i["role"]) for i in own}
    if not own or commands.AGGREGATED in roles:
        return []
    in_file = {str(w["url"]) for w in (listed or {}).get("workers") or []}
    borrowed = []
    for role in ("prefill", "decode"):
        if role in roles:
            continue
        serving = [i for i in instances if i["role"] == role and str(i["url"]) in in_file and i not in own]
        borrowed += [dict(serving[0])] if serving else []
    return borrowed


def _key(worker: Mapping[str, Any]) -> tuple[str, str, int | None]:
    port = worker.get("bootstrap_port")
    return str(worker["url"]), str(worker["worker_type"]), None if port is None else int(port)


def _describe(key: tuple[str, str, int | None]) -> str:
    url, worker_type, port = key
    return f"{worker_type} {url}" + (f" (bootstrap {port})" if port is not None else "")


def difference(listed: Mapping[str, Any], registered: Sequence[fleet.Worker]) -> list[str]:
    """What differs between the file and smg's registered set; [] when they are equal. A worker smg
    still drains counts as registered: it is not gone until smg forgets it."""
    want = {_key(w) for w in listed["workers"]}
    seen = {(w.url, w.worker_type, w.bootstrap_port): w for w in registered}
    problems = [
        f"listed in the file, not registered: {_describe(k)}" for k in sorted(want - seen.keys(), key=str)
    ]
    for key, worker in sorted(seen.items(), key=lambda item: str(item[0])):
        if key not in want:
            problems.append(f"registered ({worker.status}), not in the file: {_describe(key)}")
        elif worker.status != "ready":
            problems.append(f"listed, not ready yet: {_describe(key)} ({worker.status})")
    return problems


def check(
    workers: fleet.SmgWorkers, listed: Mapping[str, Any], timeout_s: float, interval_s: float = 0.2
) -> float:
    """Wait until smg's registered set equals the file (every listed worker `ready`, nothing else);
    the seconds waited, or FleetError naming each difference."""
    polled = poll(workers.all, lambda seen: not difference(listed, seen), timeout_s, interval_s)
    if not polled.settled:
        raise fleet.FleetError(
            f"smg's workers differ from its discovery file after {timeout_s:g} s: "
            + "; ".join(difference(listed, polled.seen))
        )
    return polled.waited_s


def write(path: Path, listed: Mapping[str, Any]) -> None:
    """Replace the discovery file in one rename (smg never reads half a list); what the play's
    pd_config_files task does, for the tools and tests that change the fleet outside a play."""
    write_atomic(path, json.dumps(listed, indent=2) + "\n")


def without(listed: Mapping[str, Any], urls: Sequence[str]) -> dict[str, Any]:
    """The manifest less the workers at `urls` (a host taken out of rotation)."""
    gone = set(urls)
    return {**listed, "workers": [w for w in listed["workers"] if w["url"] not in gone]}


def drain(
    workers: fleet.SmgWorkers,
    urls: Sequence[str],
    timeout_s: float,
    interval_s: float = 0.1,
) -> float:
    """After `urls` left the file: wait until smg no longer lists them (it stops routing to a dropped
    worker at once and forgets it after its settle), then until their engines run nothing
    (sglang:num_running_reqs 0: smg keeps the streams it opened past the settle, docs/fleet.md), so
    that stopping them loses no request. The seconds it took; FleetError naming what is left."""
    gone = set(urls)
    polled = poll(workers.all, lambda seen: not [w for w in seen if w.url in gone], timeout_s, interval_s)
    if not polled.settled:
        left = [f"{w.url} ({w.status}, load {w.load})" for w in polled.seen if w.url in gone]
        raise fleet.FleetError(
            f"still registered {timeout_s:g} s after leaving the discovery file: {', '.join(left)}"
        )
    return polled.waited_s + idle(urls, max(timeout_s - polled.waited_s, 0.0), interval_s)


def running_or_stopped(engine_url: str) -> float:
    """What one engine runs now, 0 when it refuses the connection: an engine that is stopped (a host
    retired by an earlier play, serving_fleet_retire) runs nothing. Any other failure is an error."""
    try:
        return fleet.engine_running(engine_url)
    except fleet.FleetError as exc:
        cause = exc.__cause__
        if isinstance(cause, urllib.error.URLError) and isinstance(cause.reason, ConnectionRefusedError):
            return 0.0
        if isinstance(cause, ConnectionRefusedError):
            return 0.0
        raise


def idle(
    urls: Sequence[str], timeout_s: float, interval_s: float = 0.2, stopped_is_idle: bool = False
) -> float:
    """Wait until the engines at `urls` run nothing (their sglang:num_running_reqs is 0): smg keeps
    the streams it opened on a worker past its settle, so a dropped worker is not idle when smg
    forgets it (docs/fleet.md). With `stopped_is_idle` (hosts being retired, whose programs an
    earlier play may have stopped), an engine refusing the connection counts as idle. The seconds
    waited; FleetError naming the busy ones."""
    running = running_or_stopped if stopped_is_idle else fleet.engine_running
    polled = poll(lambda: [running(u) for u in urls], lambda seen: not any(seen), timeout_s, interval_s)
    if not polled.settled:
        busy = [f"{u}: {n:g}" for u, n in zip(urls, polled.seen, strict=True) if n]
        raise fleet.FleetError(f"engines still run requests after {timeout_s:g} s: {', '.join(busy)}")
    return polled.waited_s


def fleet_lines(
    registered: Sequence[Mapping[str, Any]],
    instances: Sequence[Mapping[str, Any]],
    states: Mapping[str, Mapping[str, Any] | None],
) -> list[str]:
    """`pd-appliance status`'s view of the fleet, a line per worker: its host (by the published
    instances' URLs), smg's status (ready, pending, draining) and load, the host's release (its host
    state) and rotation; then each instance of the deployment smg does not list, and why."""
    host_of = {str(i["url"]): str(i.get("host")) for i in instances}
    out = set(out_of_rotation(states))

    def release(host: str) -> str:
        current = ((states.get(host) or {}).get("release") or {}).get("current")
        return f"release {current}" if current else "no release recorded"

    lines = []
    for w in registered:
        host = host_of.get(str(w["url"]), "?")
        rotation = (
            "draining" if w["status"] == "draining" else "out of rotation" if host in out else "in rotation"
        )
        state = f"smg {w['status']}, load {w['load']}"
        lines.append(f"{w['worker_type']} {w['url']} on {host}: {rotation}, {state}, {release(host)}")
    listed = {str(w["url"]) for w in registered}
    for url, host in host_of.items():
        if url not in listed:
            why = "out of rotation (drained)" if host in out else "NOT REGISTERED by smg"
            lines.append(f"{url} on {host}: {why}, {release(host)}")
    return lines


def _listing(workers: Sequence[fleet.Worker]) -> list[dict[str, Any]]:
    return [{"url": w.url, "worker_type": w.worker_type, "status": w.status, "load": w.load} for w in workers]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pd_appliance.serving.discovery --router URL --file F [--drained URL ...]`, the key
    on stdin with --api-key-stdin (never on a command line, nor in the environment: Ansible renders a
    task's `environment:` into the sh -c line that starts it, in /proc/*/cmdline): wait until smg's
    workers equal the file, then until the engines at each --drained URL (workers just dropped from
    it) run nothing, and those at each --retired URL (a host being retired: a stopped engine counts
    as idle). `--list` only lists smg's workers. Prints one JSON line (smg's workers included); exit
    1 naming the difference or the busy engine."""
    p = argparse.ArgumentParser(prog="pd_appliance.serving.discovery", description=__doc__.splitlines()[0])
    p.add_argument("--router", required=True, help="the router's base URL")
    p.add_argument("--file", type=Path, help="the discovery file smg reads")
    p.add_argument(
        "--drained", action="append", default=[], metavar="URL", help="an engine dropped from the file"
    )
    p.add_argument(
        "--retired",
        action="append",
        default=[],
        metavar="URL",
        help="an engine of a host being retired, dropped from the file (stopped counts as idle)",
    )
    p.add_argument("--list", action="store_true", help="list smg's workers, check nothing")
    p.add_argument("--api-key-stdin", action="store_true", help="read the router's key from stdin")
    p.add_argument("--timeout-s", type=float, default=60.0)
    args = p.parse_args(argv)
    workers = fleet.SmgWorkers(args.router, sys.stdin.readline().strip() if args.api_key_stdin else "")
    out: dict[str, Any] = {"ok": True}
    try:
        if not args.list:
            if args.file is None:
                p.error("--file is required unless --list")
            out["waited_s"] = round(check(workers, json.loads(args.file.read_text()), args.timeout_s), 2)
            if args.drained:
                out["idle_after_s"] = round(idle(args.drained, args.timeout_s), 2)
            if args.retired:
                waited = idle(args.retired, args.timeout_s, stopped_is_idle=True)
                out["retired_idle_after_s"] = round(waited, 2)
        out["workers"] = _listing(workers.all())
    except (OSError, ValueError, fleet.FleetError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
