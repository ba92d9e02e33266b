"""smg 1.13's worker API: list, add, drain and remove workers of a running router.

What the API does was measured against the real binary (docs/fleet.md, "smg 1.13 worker API,
measured"), and this client is shaped by it:
- a worker added by POST is dialled with the `api_key` of the request body, not the router's
  `--api-key`: without it the add job retries for ever on 401 and the worker never appears;
- DELETE marks the worker draining (no new requests) and forgets it after a fixed settle (5 s),
  whatever still runs on it: the engine's own running count must reach 0 before it is stopped, or
  the requests still streaming from it are lost;
- smg pairs any prefill with any decode: what a "PD group" is, the caller decides.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pd_appliance.serving.polling import poll

WORKER_TYPES = ("prefill", "decode", "regular")
# SGLang's gauge of the requests an engine runs (and the rehearsal engine's): 0 = idle.
RUNNING_GAUGE = re.compile(r"^sglang:num_running_reqs(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.MULTILINE)


class FleetError(RuntimeError):
    """A worker API call that failed, with what to fix."""


@dataclass(frozen=True)
class Worker:
    """One worker as smg lists it (GET /workers)."""

    id: str
    url: str
    worker_type: str
    status: str  # pending, ready, draining
    healthy: bool
    load: int
    bootstrap_port: int | None

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Worker:
        """smg's worker object (only the fields a fleet change needs)."""
        port = raw.get("bootstrap_port")
        return cls(
            id=str(raw["id"]),
            url=str(raw["url"]),
            worker_type=str(raw.get("worker_type", "")),
            status=str(raw.get("status", "")),
            healthy=bool(raw.get("is_healthy")),
            load=int(raw.get("load") or 0),
            bootstrap_port=None if port is None else int(port),
        )


Transport = Callable[[str, str, dict[str, Any] | None, str], tuple[int, Any]]


def _urllib(method: str, url: str, body: dict[str, Any] | None, api_key: str) -> tuple[int, Any]:
    """One HTTP exchange; the status and the JSON (or text) answer, HTTP errors included."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError as exc:
        raise FleetError(f"{method} {url}: {exc} (is the router running and its port right?)") from exc
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


class SmgWorkers:
    """The worker API of one smg router (`base_url`, its `--api-key`)."""

    def __init__(self, base_url: str, api_key: str, transport: Transport = _urllib) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._http = transport

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        status, answer = self._http(method, self.base_url + path, body, self.api_key)
        if status == 401:
            raise FleetError(
                f"{method} {path}: smg refused the key (401: {answer}); give the router's --api-key "
                "(serving_router_api_key)"
            )
        return status, answer

    def all(self) -> list[Worker]:
        """Every worker smg routes to or drains."""
        status, answer = self._call("GET", "/workers")
        if status != 200:
            raise FleetError(f"GET /workers answered {status}: {answer}")
        return [Worker.from_json(w) for w in answer["workers"]]

    def get(self, worker_id: str) -> Worker | None:
        """One worker, or None once smg has forgotten it (404)."""
        status, answer = self._call("GET", f"/workers/{worker_id}")
        if status == 404:
            return None
        if status != 200:
            raise FleetError(f"GET /workers/{worker_id} answered {status}: {answer}")
        return Worker.from_json(answer)

    def add(self, url: str, worker_type: str, worker_api_key: str, bootstrap_port: int | None = None) -> str:
        """Queue a worker's registration; its id. `worker_api_key` is what smg sends to the worker
        (the engines' --api-key): smg does not give a POSTed worker its own --api-key."""
        if worker_type not in WORKER_TYPES:
            raise FleetError(f"worker_type must be one of {', '.join(WORKER_TYPES)}, got {worker_type!r}")
        if (worker_type == "prefill") != (bootstrap_port is not None):
            raise FleetError(
                f"{url}: a prefill worker needs its bootstrap port and only a prefill has one "
                f"(worker_type {worker_type}, bootstrap_port {bootstrap_port})"
            )
        body: dict[str, Any] = {"url": url, "worker_type": worker_type}
        if bootstrap_port is not None:
            body["bootstrap_port"] = int(bootstrap_port)
        if worker_api_key:
            body["api_key"] = worker_api_key
        status, answer = self._call("POST", "/workers", body)
        if status == 409:
            raise FleetError(
                f"{url} is being added already ({answer}); wait for that job or fix what it fails on "
                "(GET the worker: a 401 in its job means the worker's key is missing or wrong)"
            )
        if status != 202:
            raise FleetError(f"POST /workers for {url} answered {status}: {answer}")
        return str(answer["worker_id"])

    def remove(self, worker_id: str) -> None:
        """Deregister: smg stops routing to the worker at once and forgets it after its settle."""
        status, answer = self._call("DELETE", f"/workers/{worker_id}")
        if status not in (202, 404):
            raise FleetError(f"DELETE /workers/{worker_id} answered {status}: {answer}")

    def wait_ready(
        self, worker_ids: Sequence[str], timeout_s: float, interval_s: float = 0.1
    ) -> list[Worker]:
        """Wait until every worker is `ready`; the workers, or an error naming those that are not."""
        polled = poll(lambda: [self.get(i) for i in worker_ids],
                      lambda seen: all(w is not None and w.status == "ready" for w in seen),
                      timeout_s, interval_s)  # fmt: skip
        if not polled.settled:
            late = [f"{i}: {w.status if w else 'gone'}" for i, w in zip(worker_ids, polled.seen, strict=True)
                    if w is None or w.status != "ready"]  # fmt: skip
            raise FleetError(
                f"workers not ready after {timeout_s:g} s ({'; '.join(late)}): is the engine healthy, "
                "and its key in the add request?"
            )
        return [w for w in polled.seen if w is not None]

    def wait_removed(self, worker_ids: Sequence[str], timeout_s: float, interval_s: float = 0.1) -> float:
        """Wait until smg has forgotten every worker (the settle after DELETE); the seconds waited."""
        polled = poll(lambda: [self.get(i) for i in worker_ids], lambda seen: all(w is None for w in seen),
                      timeout_s, interval_s)  # fmt: skip
        if not polled.settled:
            left = [f"{w.id} ({w.status}, load {w.load})" for w in polled.seen if w is not None]
            raise FleetError(f"still registered {timeout_s:g} s after DELETE: {', '.join(left)}")
        return polled.waited_s


def running_requests(metrics_text: str) -> float:
    """The engine's running requests from its /metrics (every labelled series summed)."""
    found = RUNNING_GAUGE.findall(metrics_text)
    if not found:
        raise FleetError(
            "no sglang:num_running_reqs in the engine's /metrics: start it with --enable-metrics"
        )
    return sum(float(v) for v in found)


def engine_running(engine_url: str, transport: Transport = _urllib) -> float:
    """What one engine runs now (its /metrics needs no key)."""
    status, answer = transport("GET", engine_url.rstrip("/") + "/metrics", None, "")
    if status != 200:
        raise FleetError(f"GET {engine_url}/metrics answered {status}")
    return running_requests(str(answer))


def drain(
    workers: SmgWorkers,
    worker_ids: Sequence[str],
    engine_urls: Sequence[str],
    timeout_s: float,
    interval_s: float = 0.1,
) -> float:
    """Deregister the workers, wait until smg forgot them, then until their engines run nothing:
    after that, stopping them loses no request. The seconds it took."""
    for worker_id in worker_ids:
        workers.remove(worker_id)
    waited = workers.wait_removed(worker_ids, timeout_s, interval_s)
    polled = poll(lambda: [engine_running(u) for u in engine_urls], lambda seen: not any(seen),
                  max(timeout_s - waited, 0.0), interval_s)  # fmt: skip
    if not polled.settled:
        busy = [f"{u}: {n:g}" for u, n in zip(engine_urls, polled.seen, strict=True) if n]
        raise FleetError(
            f"engines still run requests {timeout_s:g} s after the drain began ({', '.join(busy)})"
        )
    return waited + polled.waited_s
