"""Restart the programs a release change touches, in an order that keeps serving where it can.

    python -m pd_appliance.release.rollout --serverurl unix:///run/pd-appliance/supervisor.sock \
        --programs '{"prefill": {"role": "prefill", "health_url": "http://..."}, ...}' \
        [--switch] [--restart NAME ...] [--group pd] [--health-timeout-s 1800]

It reads the changed supervisor sections (supervisord's reloadConfig and the pd_appliance RPC
extension, as pd_appliance.serving.apply does) and plans the restarts (`plan`):

- `--switch` (new code or weights: another SGLang build or checkpoint revision): every changed worker
  is stopped before any is started on the new release, so prefill and decode never run different
  builds or revisions side by side and exchange KV between them;
- otherwise (flags, env hooks): one worker at a time, and before the next worker of the same role
  is restarted the previous one must answer its health URL, so where a role has several instances
  the others keep serving;
- the router last, after every worker (it routes to them).

`--restart` names programs whose env file changed (their section did not). Prints one JSON object:
{"changed": bool, "actions": {"pd:decode": "restarted", ...}, "waves": [[...], ...]}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
import xmlrpc.client
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pd_appliance.release.errors import ReleaseError
from pd_appliance.release.record import ROUTER
from pd_appliance.serving import apply as serving_apply
from pd_appliance.serving.polling import poll

FAILED_STATES = {"FATAL", "BACKOFF", "EXITED"}


@dataclass
class Step:
    """Restart `names` together: stop them all, then start them all; `wait` for their health after."""

    names: list[str]
    wait: bool = False


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)

    def waves(self) -> list[list[str]]:
        return [s.names for s in self.steps]


def plan(todo: Sequence[str], roles: dict[str, str], *, switch: bool, order: Sequence[str] = ()) -> Plan:
    """The restart steps for the programs in `todo` (names), given each program's role.

    `order` is supervisor's priority order (workers before the router); programs not in it keep the
    order of `todo`. See the module docstring for the rules.
    """
    ranked = [n for n in order if n in todo] + [n for n in todo if n not in order]
    workers = [n for n in ranked if roles.get(n, n) != ROUTER]
    routers = [n for n in ranked if roles.get(n, n) == ROUTER]
    out = Plan()
    if switch and workers:
        out.steps.append(Step(workers, wait=False))
    else:
        last_of_role: dict[str, Step] = {}
        for name in workers:
            role = roles.get(name, name)
            if role in last_of_role:
                last_of_role[role].wait = True  # the previous instance of this role answers first
            step = Step([name])
            out.steps.append(step)
            last_of_role[role] = step
    for name in routers:
        out.steps.append(Step([name]))
    return out


def wait_healthy(
    server: Any,
    full_name: str,
    url: str,
    timeout_s: float,
    interval_s: float = 1.0,
    fetch: Callable[[str], int] | None = None,
) -> float:
    """Seconds until `url` answered 2xx; ReleaseError when the program fails or the time runs out."""
    status_of = fetch or _status_of

    def look() -> tuple[str, int]:
        state = str(server.supervisor.getProcessInfo(full_name)["statename"])
        return state, (status_of(url) if state == "RUNNING" else 0)

    polled = poll(look, lambda seen: seen[0] in FAILED_STATES or 200 <= seen[1] < 300, timeout_s, interval_s)
    if polled.seen[0] in FAILED_STATES:
        raise ReleaseError(
            f"{full_name} went {polled.seen[0]} while restarting onto the new release; `supervisorctl tail"
            f" {full_name}` shows why, and the programs not yet restarted still run the old one"
        )
    if not polled.settled:
        raise ReleaseError(f"{full_name} did not answer {url} within {timeout_s:.0f} s after its restart")
    return polled.waited_s


def _status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return 0


def rollout(
    server: Any,
    programs: dict[str, dict[str, Any]],
    *,
    group: str = "pd",
    switch: bool = False,
    restart: Sequence[str] = (),
    health_timeout_s: float = 1800.0,
    wait: bool = False,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Bring the group's programs to the config files, restarting as `plan` says; with `wait`, return only
    once every program it started answers its health URL (a rollback waits so; serve waits in its role)."""
    added, changed, removed = server.supervisor.reloadConfig()[0]
    if group in added or group in removed:
        return serving_apply.apply(server, group, restart, log=log)  # the whole group starts or goes
    active = {i["name"]: i for i in server.supervisor.getAllProcessInfo() if i["group"] == group}
    diff = (
        server.pd_appliance.diffProcesses(group)
        if group in changed
        else {"added": [], "changed": [], "removed": []}
    )
    actions: dict[str, str] = {}
    for name in diff["removed"]:
        serving_apply.stop_program(server, f"{group}:{name}")
        server.pd_appliance.removeProcess(group, name)
        actions[f"{group}:{name}"] = "removed"
    replaced = set(diff["changed"]) | set(diff["added"])
    env_only = [n for n in restart if n in active and n not in replaced]
    todo = [*diff["changed"], *diff["added"], *env_only]
    roles = {n: str((programs.get(n) or {}).get("role") or n) for n in todo}
    order = diff.get("order") or [*diff["changed"], *diff["added"]]
    steps = plan(todo, roles, switch=switch, order=order)
    for step in steps.steps:
        for name in step.names:
            if name not in diff["added"]:
                log(f"{group}:{name}: stopping ({'switching release' if switch else 'config changed'})")
                serving_apply.stop_program(server, f"{group}:{name}")
        for name in step.names:
            full = f"{group}:{name}"
            was_running = active.get(name, {}).get("statename") in serving_apply.RUNNING_STATES
            if name in replaced:
                server.pd_appliance.replaceProcess(group, name)
            if was_running or name in diff["added"] or name in env_only:
                time.sleep(0.2)  # autostart programs are spawned by supervisord's own loop
                if server.supervisor.getProcessInfo(full)["statename"] not in serving_apply.RUNNING_STATES:
                    serving_apply.start_program(server, full)
            actions[full] = "added" if name in diff["added"] else "restarted"
        if step.wait:
            for name in step.names:
                url = (programs.get(name) or {}).get("health_url")
                if url:
                    took = wait_healthy(server, f"{group}:{name}", url, health_timeout_s)
                    log(f"{group}:{name}: healthy after {took:.1f} s; next instance of its role")
    if wait:
        for full in [f for f, a in actions.items() if a != "removed"]:
            url = (programs.get(full.split(":", 1)[1]) or {}).get("health_url")
            if url:
                took = wait_healthy(server, full, url, health_timeout_s)
                log(f"{full}: healthy after {took:.1f} s")
    return {"changed": bool(actions), "actions": actions, "waves": steps.waves(), "switch": switch}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pd_appliance.release.rollout", description=__doc__.split("\n")[0]
    )
    p.add_argument("--serverurl", required=True)
    p.add_argument("--group", default="pd")
    p.add_argument("--programs", default="{}", help="JSON: program name -> {role, health_url}")
    p.add_argument(
        "--switch", action="store_true", help="the workers change SGLang build or checkpoint revision"
    )
    p.add_argument("--restart", nargs="*", default=[])
    p.add_argument("--health-timeout-s", type=float, default=1800.0)
    p.add_argument("--wait", action="store_true", help="return once every restarted program is healthy")
    args = p.parse_args(argv)
    server = serving_apply.connect(args.serverurl)
    try:
        result = rollout(
            server,
            json.loads(args.programs),
            group=args.group,
            switch=args.switch,
            restart=args.restart,
            health_timeout_s=args.health_timeout_s,
            wait=args.wait,
            log=lambda m: print(m, file=sys.stderr),
        )
    except (xmlrpc.client.Fault, OSError, ReleaseError, json.JSONDecodeError) as exc:
        message = exc.message if isinstance(exc, ReleaseError) else f"supervisord at {args.serverurl}: {exc}"
        print(json.dumps({"changed": True, "failed": True, "msg": message}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
