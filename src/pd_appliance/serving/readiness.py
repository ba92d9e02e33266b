"""Is the appliance ready? The router says so and a prefill and a decode (or, over aggregated
instances, one of them) answer their health now.

    python -m pd_appliance.serving.readiness --router http://127.0.0.1:8000 [--api-key-env VAR]
        [--worker-health-path /health] [--wait-s 900 --interval-s 2] [--timeout-s 30]

Prints one JSON object; exits 0 when ready, 1 when not (after --wait-s, if given), 2 on bad usage.

Why not smg's /readiness alone: smg 1.13 turns a worker it marks unhealthy into an unretried 503
for every request, so the serving role keeps a restarting worker "healthy" in smg's eyes for the
whole outage grace (serving_router_worker_outage_grace_s, 300 s) while smg retries the requests for
it. Its /readiness therefore stays 200 while no decode can take a request. This check asks the
router which workers it routes to (GET /workers) and probes each one's health URL itself, so it
says "not ready" from the first failed probe and "ready" again once a decode answers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pd_appliance.serving.day2 import probe
from pd_appliance.serving.polling import poll

# Roles that must each have one answering worker (SGLang PD: a request needs both legs).
ROLES = ("prefill", "decode")
# smg's worker_type for a worker of its regular mode (GET /workers), the appliance's aggregated
# instances: one answering worker serves a request whole.
REGULAR = "regular"


class RouterError(RuntimeError):
    """The router's worker list could not be read."""


def router_workers(router: str, api_key: str = "", timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """smg's GET /workers: [{url, worker_type, is_healthy, ...}] (Bearer key when the router has one)."""
    request = urllib.request.Request(router.rstrip("/") + "/workers")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        hint = " (set the router's API key: --api-key-env)" if exc.code == 401 else ""
        raise RouterError(f"GET {router}/workers: HTTP {exc.code}{hint}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RouterError(f"GET {router}/workers: {getattr(exc, 'reason', exc)}") from exc
    workers = body.get("workers") if isinstance(body, dict) else None
    if not isinstance(workers, list):
        raise RouterError(f"GET {router}/workers: no 'workers' list in the answer")
    return [w for w in workers if isinstance(w, dict) and w.get("url")]


def verdict(router_status: Mapping[str, Any], workers: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """Ready iff the router's /readiness is 200 and each PD role (or, when the router lists regular
    workers, the aggregated instances) has a worker that can take a request: its health URL answers
    2xx now and the router has not marked it unhealthy (it routes there)."""
    if not router_status.get("ok"):
        seen = router_status.get("status", router_status.get("error", "no answer"))
        return False, f"router /readiness: {seen}"
    missing = []
    roles = (REGULAR,) if any(w.get("worker_type") == REGULAR for w in workers) else ROLES
    for role in roles:
        mine = [w for w in workers if w.get("worker_type") == role]
        if not any(w.get("health", {}).get("ok") and w.get("router_healthy") is not False for w in mine):
            seen = "; ".join(_describe(w) for w in mine)
            label = "aggregated instance (smg regular worker)" if role == REGULAR else role
            missing.append(f"no {label} answers its health URL ({seen or 'the router lists none'})")
    return (not missing), ("; ".join(missing) if missing else "ready")


def _describe(worker: Mapping[str, Any]) -> str:
    health = worker.get("health", {})
    said = health.get("status", health.get("error", "?"))
    return f"{worker['url']}: {said}" + (
        ", unhealthy for the router" if worker.get("router_healthy") is False else ""
    )


def check(
    router: str,
    api_key: str = "",
    worker_health_path: str = "/health",
    timeout_s: float = 30.0,
    probe_url: Callable[[str, float], dict[str, Any]] = probe,
) -> dict[str, Any]:
    """One look: the router's /readiness, its worker list, every listed worker's health (in parallel)."""
    started = time.monotonic()
    router_status = probe_url(router.rstrip("/") + "/readiness", timeout_s)
    workers: list[dict[str, Any]] = []
    error = None
    if router_status.get("ok"):
        try:
            listed = router_workers(router, api_key, timeout_s)
        except RouterError as exc:
            error = str(exc)
            listed = []
        workers = [
            {"url": w["url"], "worker_type": w.get("worker_type"), "router_healthy": w.get("is_healthy")}
            for w in listed
        ]
        with ThreadPoolExecutor(max(len(workers), 1)) as pool:
            results = pool.map(
                lambda w: probe_url(w["url"].rstrip("/") + worker_health_path, timeout_s), workers
            )
            for worker, health in zip(workers, results, strict=True):
                worker["health"] = health
    ready, reason = verdict(router_status, workers)
    if error:
        ready, reason = False, error
    return {
        "ready": ready,
        "reason": reason,
        "router": router_status,
        "workers": workers,
        "checked_in_s": round(time.monotonic() - started, 3),
    }


def wait(
    look: Callable[[], dict[str, Any]],
    wait_s: float,
    interval_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Look until ready or `wait_s` passed; the last look, with how long it took to get there."""
    polled = poll(look, lambda result: bool(result["ready"]), wait_s, interval_s, clock, sleep)
    return {**polled.seen, "waited_s": round(polled.waited_s, 1)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.serving.readiness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--router", required=True, help="router base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key-env", default="", help="environment variable holding the router's key")
    parser.add_argument(
        "--api-key-stdin", action="store_true",
        help="read the router's key from stdin (Ansible's `environment:` would put it on a command line)",
    )  # fmt: skip
    parser.add_argument("--worker-health-path", default="/health")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per probe")
    parser.add_argument("--wait-s", type=float, default=0.0, help="look again until ready, this long")
    parser.add_argument("--interval-s", type=float, default=2.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    api_key = os.environ.get(args.api_key_env, "") if args.api_key_env else ""
    if args.api_key_stdin:
        api_key = sys.stdin.readline().strip()
    result = wait(
        lambda: check(args.router, api_key, args.worker_health_path, args.timeout_s),
        args.wait_s,
        args.interval_s,
    )
    print(json.dumps(result))
    return 0 if result["ready"] else 1


if __name__ == "__main__":
    sys.exit(main())
