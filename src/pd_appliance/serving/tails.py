"""The state, health and log tail of a host's programs: why a configuration did not come up.

    python -m pd_appliance.serving.tails --serverurl unix:///run/pd-appliance/supervisor.sock \
        --log-dir /var/log/pd-appliance --lines 60 \
        --health prefill=http://127.0.0.1:30000/health --health router=http://127.0.0.1:8000/readiness

Prints {"programs": {name: {state, description, health, up, log_tail?}}, "down": [names]}: `up` is
RUNNING with a 2xx health answer. `down` names the programs to blame, each with the tail of its
log: every worker that is not up (a crash loop shows as BACKOFF, FATAL, EXITED or STARTING between
retries, or RUNNING in the moment between supervisor's startsecs and the next crash; a missed
health deadline as RUNNING and unhealthy), and the router only when it is not running, or when every
worker here is up: a router that waits for a crashed worker is RUNNING and not ready, and not to blame.

The tuner reads this on every PD host after a candidate variant failed to come up
(roles/validation/tasks/variant.yml, through roles/serving/tasks/program_tails.yml) and reports
the tails with the candidate it rules out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pd_appliance.serving.apply import connect
from pd_appliance.serving.day2 import probe
from pd_appliance.serving.wait import log_tail, program_state

GROUP = "pd"
ROUTER = "router"  # the router's program name (roles/serving: pd:router)


def blamed(programs: Mapping[str, Mapping[str, Any]], router: str = ROUTER) -> list[str]:
    """The programs that did not come up: the workers not up, and the router as above."""
    workers = [name for name, p in programs.items() if name != router and not p.get("up")]
    proxy = programs.get(router)
    if proxy is not None and not proxy.get("up") and (proxy.get("state") != "RUNNING" or not workers):
        return [*workers, router]
    return workers


def read(
    health: Mapping[str, str],
    state: Callable[[str], tuple[str, str]],
    check: Callable[[str], dict[str, Any]],
    tail: Callable[[str], str],
) -> dict[str, Any]:
    """Each program's state and health; the log tail of each blamed one."""
    programs: dict[str, dict[str, Any]] = {}
    for name, url in health.items():
        statename, description = state(name)
        answer = check(url) if statename == "RUNNING" else {}
        programs[name] = {
            "state": statename,
            "description": description,
            "health": answer,
            "up": statename == "RUNNING" and bool(answer.get("ok")),
        }
    down = blamed(programs)
    for name in down:
        programs[name]["log_tail"] = tail(name)
    return {"programs": programs, "down": down}


def _health_pair(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url:
        raise argparse.ArgumentTypeError(f"--health takes NAME=URL, got {text!r}")
    return name, url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.serving.tails", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--serverurl", required=True)
    parser.add_argument("--log-dir", required=True, help="the programs' logs are <log-dir>/<name>.log")
    parser.add_argument("--lines", type=int, default=60)
    parser.add_argument("--health", type=_health_pair, action="append", default=[], help="NAME=URL")
    args = parser.parse_args(argv)
    server = connect(args.serverurl)
    result = read(
        dict(args.health),
        lambda name: program_state(server, f"{GROUP}:{name}"),
        lambda url: probe(url, timeout_s=5.0),
        lambda name: log_tail(str(Path(args.log_dir) / f"{name}.log"), args.lines),
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
