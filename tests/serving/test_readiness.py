"""The appliance's readiness verdict (the real router and workers: tests/faults)."""

from __future__ import annotations

from pd_appliance.serving.readiness import verdict, wait

UP = {"ok": True, "status": 200}
ROUTER_READY = {"ok": True, "status": 200}


def _worker(role: str, health: dict, router_healthy: bool = True, port: int = 1) -> dict:
    return {
        "url": f"http://h:{port}",
        "worker_type": role,
        "router_healthy": router_healthy,
        "health": health,
    }


def test_ready_needs_the_router_and_an_answering_worker_per_role() -> None:
    assert verdict(ROUTER_READY, [_worker("prefill", UP), _worker("decode", UP)]) == (True, "ready")
    ready, reason = verdict(
        ROUTER_READY, [_worker("prefill", UP), _worker("decode", {"ok": False, "error": "refused"})]
    )
    assert not ready and reason == "no decode answers its health URL (http://h:1: refused)"
    ready, reason = verdict({"ok": False, "status": 503}, [_worker("prefill", UP), _worker("decode", UP)])
    assert not ready and reason == "router /readiness: 503"
    ready, reason = verdict(ROUTER_READY, [_worker("decode", UP)])
    assert not ready and "no prefill answers its health URL (the router lists none)" in reason


def test_a_decode_the_router_will_not_use_does_not_count() -> None:
    workers = [
        _worker("prefill", UP),
        _worker("decode", UP, router_healthy=False, port=2),
        _worker("decode", {"ok": False, "status": 503}, port=3),
    ]
    ready, reason = verdict(ROUTER_READY, workers)
    assert not ready
    assert (
        reason
        == "no decode answers its health URL (http://h:2: 200, unhealthy for the router; http://h:3: 503)"
    )
    workers[2]["health"] = UP
    assert verdict(ROUTER_READY, workers)[0]


def test_wait_looks_again_until_ready_or_the_deadline() -> None:
    now = [0.0]
    looks = iter([{"ready": False}, {"ready": False}, {"ready": True}])
    result = wait(
        lambda: dict(next(looks)), 10, 2, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )
    assert result == {"ready": True, "waited_s": 4.0}
    now[0] = 0.0
    result = wait(
        lambda: {"ready": False}, 5, 2, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )
    assert result == {"ready": False, "waited_s": 6.0}


def test_over_aggregated_instances_one_answering_regular_worker_is_ready() -> None:
    """smg's regular mode lists aggregated instances as worker_type "regular" (GET /workers)."""
    down = {"ok": False, "error": "refused"}
    assert verdict(ROUTER_READY, [_worker("regular", down), _worker("regular", UP, port=2)]) == (
        True,
        "ready",
    )
    ready, reason = verdict(ROUTER_READY, [_worker("regular", down), _worker("regular", UP, False, port=2)])
    assert not ready and reason == (
        "no aggregated instance (smg regular worker) answers its health URL "
        "(http://h:1: refused; http://h:2: 200, unhealthy for the router)"
    )
