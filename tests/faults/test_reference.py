"""References for the fault table (benchmarks/faults.py; PD_FAULTS_REFERENCE=1, not in CI).

Measured in the same run as the suite, on the same deployment, with only smg's settings changed
(a converge that restarts pd:router alone), then put back:

1. issue 15's settings (main before this work: breaker on, 15 s breaker timeout, smg's default
   retries and health thresholds): a decode SIGKILL loses the requests sent after it too.
2. an outage longer than the grace (serving_router_worker_outage_grace_s=4, decode stopped for
   20 s): what smg 1.13 cannot do. Requests wait out their retries (about 4 s) and fail 502; once
   smg marks the decode unhealthy they fail 503 at once; none waits for the decode's return.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from pd_appliance.bench.faults import LoadSpec, kill_program, measure
from pd_appliance.serving.apply import connect
from rehearsal_deployment import Deployment

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PD_FAULTS_REFERENCE") != "1", reason="benchmarks/faults.py only"),
]

ISSUE_15 = {
    "serving_router_circuit_breaker": True, "serving_router_cb_failure_threshold": 10,
    "serving_router_cb_timeout_duration_secs": 15, "serving_router_retry_max_retries": 5,
    "serving_router_retry_initial_backoff_ms": 50, "serving_router_retry_max_backoff_ms": 30000,
    "serving_router_retry_backoff_multiplier": 1.5, "serving_router_health_failure_threshold": 3,
    "serving_router_health_success_threshold": 2,
}  # fmt: skip


def _with_router_settings(dep: Deployment, settings: dict[str, Any]) -> None:
    result = dep.converge("-e", json.dumps(settings))
    assert result.returncode == 0, result.stdout[-4000:]


def test_issue_15_settings_lose_the_requests_after_a_decode_kill(
    deployment: Deployment, fault_report: dict[str, Any]
) -> None:
    _with_router_settings(deployment, ISSUE_15)
    try:
        assert deployment.wait_ready(60)["ready"]
        spec = LoadSpec(rate_rps=16, duration_s=25, fault_at_s=3, max_tokens=48, request_timeout_s=120)
        kill = lambda: kill_program(deployment.serverurl, "decode")  # noqa: E731
        r = measure(deployment.router, "dsv4-flash", spec, kill, deployment.ready, deployment.api_key)
        fault_report["reference: SIGKILL pd:decode, issue 15's smg settings"] = r
        assert r["failed_after"] > 0  # the breaker's unretried 503s
    finally:
        _with_router_settings(deployment, {})


def test_an_outage_longer_than_the_grace_is_not_ridden_out(
    deployment: Deployment, fault_report: dict[str, Any]
) -> None:
    _with_router_settings(deployment, {"serving_router_worker_outage_grace_s": 4})
    server = connect(deployment.serverurl)
    try:
        assert deployment.wait_ready(60)["ready"]

        def outage() -> float:
            at = time.perf_counter()
            server.supervisor.stopProcess("pd:decode", True)
            time.sleep(20)
            server.supervisor.startProcess("pd:decode", False)
            return at

        spec = LoadSpec(rate_rps=8, duration_s=40, fault_at_s=3, max_tokens=48, request_timeout_s=120)
        r = measure(deployment.router, "dsv4-flash", spec, outage, deployment.ready, deployment.api_key)
        fault_report["reference: pd:decode stopped 20 s, outage grace 4 s"] = r
        assert r["failed_after"] > 0 and "HTTP 503" in r["errors"]
    finally:
        if server.supervisor.getProcessInfo("pd:decode")["statename"] not in ("RUNNING", "STARTING"):
            server.supervisor.startProcess("pd:decode", True)
        _with_router_settings(deployment, {})
