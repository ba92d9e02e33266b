"""A rehearsal deployment watched by the real Prometheus (Debian's package) that the monitoring role runs.

One converge of playbooks/serve.yml and playbooks/monitor.yml against inventory/rehearsal (private
appliance_root, free ports, 1 s scrape and evaluation intervals, a 3 s worker-down delay), then:
every target up, every SGLang metric the dashboard uses present after traffic, every dashboard
query accepted by Prometheus, PDWorkerDown firing after pd:decode is stopped and clearing once it is
back, and a second converge of the monitor stage that changes nothing. Everything started is
stopped at the end.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from monitoring_testlib import ROOT

from pd_appliance.serving.polling import poll
from pd_testlib import recap, run_playbook
from rehearsal_deployment import PD_PORTS, Deployment, private_deployment

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None or shutil.which("prometheus-node-exporter") is None,
        reason="Debian's prometheus and prometheus-node-exporter packages are absent",
    ),
]
DASHBOARD = ROOT / "roles/monitoring/files/dashboards/pd-appliance.json"
WAIT_S = 60.0


def _get(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


ROUTER_KEY = "monitor-test-router-key"


def _post(url: str, body: dict[str, Any]) -> int:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ROUTER_KEY}"}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=30) as r:
        r.read()
        return r.status


def _until(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """What `check` returns once it is truthy; an OSError counts as not yet (a port still opening)."""

    def look() -> Any:
        try:
            return check()
        except OSError as exc:
            return exc

    polled = poll(look, lambda seen: bool(seen) and not isinstance(seen, OSError), timeout, 0.5)
    if not polled.settled:
        raise AssertionError(f"{what} not within {timeout:.0f} s (last: {polled.seen!r})")
    return polled.seen


class Monitored(Deployment):
    """The deployment with its Prometheus: instant queries and firing alerts."""

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{json.loads(self.vars_file.read_text())['monitoring_prometheus_port']}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = _get(f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert data["status"] == "success", data
        return data["data"]["result"]

    def firing(self, alert: str) -> list[dict[str, Any]]:
        alerts = _get(f"{self.prometheus}/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == alert and a["state"] == "firing"]

    def said(self, *args: str) -> str:
        """supervisorctl's answer, both streams."""
        done = self.ctl(*args)
        return done.stdout + done.stderr


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    # Test settings: scrape and evaluate every second, call a worker down after 3 s.
    fast = {
        "monitoring_prometheus_scrape_interval": "1s",
        "monitoring_prometheus_evaluation_interval": "1s",
        "monitoring_alert_worker_down_for": "3s",
    }
    base = tmp_path_factory.mktemp("monitor-rehearsal")
    dep, _ = private_deployment(base, named_ports=PD_PORTS, api_key=ROUTER_KEY, variables=fast)
    dep = Monitored(dep.root, dep.vars_file, dep.router, dep.api_key)
    try:
        first = dep.converge()
        assert first.returncode == 0, first.stdout[-5000:]
        monitor = dep.play("playbooks/monitor.yml")
        assert monitor.returncode == 0, monitor.stdout[-5000:]
        yield dep
    finally:
        print(dep.said("status"))
        dep.stop()


def test_every_target_is_up(deployment: Monitored) -> None:
    status = deployment.said("status", "monitor:*")
    assert status.count("RUNNING") == 3, status
    expected = {
        ("sglang", "prefill"),
        ("sglang", "decode"),
        ("smg", ""),
        ("node", ""),
        ("gpu", ""),
        ("prometheus", ""),
    }

    def all_up() -> bool:
        seen = {(r["metric"]["job"], r["metric"].get("role", "") if r["metric"]["job"] == "sglang" else "")
                for r in deployment.query("up == 1")}  # fmt: skip
        return seen == expected

    _until("all six targets up", all_up)


def test_gpu_series_are_the_simulated_gpus_labelled_by_role(deployment: Monitored) -> None:
    series = _until("GPU series", lambda: deployment.query("pd_gpu_up"))
    roles = {r["metric"]["gpu"]: r["metric"]["role"] for r in series}
    assert roles == {str(i): "prefill" if i < 4 else "decode" for i in range(8)}
    assert {r["metric"]["stand_in"] for r in series} == {
        "simulated GPUs (pd_standins.nvml, standins/declared.yml)"
    }
    assert all(r["metric"]["host"] == "localhost" for r in series)


def test_dashboard_metrics_exist_after_traffic_and_every_panel_query_runs(deployment: Monitored) -> None:
    for stream in (False, True, False, True):
        body = {"model": "dsv4-flash", "messages": [{"role": "user", "content": "hello monitoring"}],
                "max_tokens": 16, "ignore_eos": True, "stream": stream}  # fmt: skip
        assert _post(deployment.router + "/v1/chat/completions", body) == 200
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = sorted(
        {re.sub(r"_(bucket|sum|count)$", "", n) for e in exprs for n in re.findall(r"sglang:[a-z0-9_]+", e)}
    )
    assert len(names) >= 10, names

    def present() -> list[str]:
        missing = [
            n for n in names if not deployment.query(f'count({{__name__=~"{n}(_bucket)?",job="sglang"}})')
        ]
        return [] if missing else names

    _until(f"every SGLang metric of the dashboard ({names})", present, timeout=30)

    def decode_ttft_count() -> float:
        result = deployment.query('sum(sglang:time_to_first_token_seconds_count{engine_type="decode"})')
        return float(result[0]["value"][1]) if result else 0.0

    # The four requests, each timed once by the decode worker, in the next scrapes.
    _until("four TTFT observations on decode", lambda: decode_ttft_count() >= 4, timeout=30)
    for expr in exprs:
        deployment.query(expr.replace("$__rate_interval", "1m").replace("$host", ".*"))


def test_worker_down_alert_fires_when_decode_stops_and_clears_when_it_is_back(deployment: Monitored) -> None:
    assert not deployment.firing("PDWorkerDown")
    assert "stopped" in deployment.said("stop", "pd:decode")
    try:
        firing = _until("PDWorkerDown firing", lambda: deployment.firing("PDWorkerDown"))
        assert [a["labels"]["role"] for a in firing] == ["decode"]
    finally:
        assert "started" in deployment.said("start", "pd:decode")
    _until("PDWorkerDown cleared", lambda: not deployment.firing("PDWorkerDown") or None)


def test_second_monitor_converge_changes_nothing(deployment: Monitored) -> None:
    pids = deployment.said("status", "monitor:*")
    second = run_playbook("playbooks/monitor.yml", "inventory/rehearsal", "-e", f"@{deployment.vars_file}",
                          timeout=600)  # fmt: skip
    assert second.returncode == 0, second.stdout[-4000:]
    assert recap(second.stdout)["changed"] == 0, second.stdout[-6000:]
    assert [line.split("pid")[1].split(",")[0] for line in pids.splitlines()] == [
        line.split("pid")[1].split(",")[0] for line in deployment.said("status", "monitor:*").splitlines()
    ]
