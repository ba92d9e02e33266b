"""The PD dashboard: what it queries, and its provisioning through Grafana's HTTP API.

Grafana itself is not in Debian and cannot be installed here: its API is stood in for by a small
HTTP server in this file that answers the two calls the role makes (GET /api/dashboards/uid/<uid>,
POST /api/dashboards/db) and checks the bearer token, as Grafana does.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from monitoring_testlib import ROOT, find_sglang_wheel, wheel_metrics

from pd_testlib import recap, run_playbook

DASHBOARD = ROOT / "roles/monitoring/files/dashboards/pd-appliance.json"
TOKEN = "glsa_test-token-never-logged"


def _exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_shows_what_the_issue_asks_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "pd-appliance"
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    wanted_panels = ["Request rate", "TTFT", "TPOT", "ITL", "Running requests per instance",
                     "Queued requests per instance", "KV transfer", "GPU utilization", "GPU power",
                     "GPU memory"]  # fmt: skip
    for wanted in wanted_panels:
        assert wanted in titles
    text = " ".join(_exprs())
    for per_role in ("pd_gpu_utilization_ratio", "pd_gpu_power_watts", "pd_gpu_memory_used_bytes"):
        assert re.search(rf"by \(host, role\) \({per_role}", text), per_role
    # Per-host rotation (issue 27): the series the alert rules record, one per host, 1 in / 0 out.
    rotation = next(p for p in dashboard["panels"] if p["title"] == "Hosts in rotation")
    assert rotation["targets"][0]["expr"] == 'max by (host) (pd_appliance_fleet_in_rotation{host=~"$host"})'
    mapped = rotation["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert (mapped["0"]["text"], mapped["1"]["text"]) == ("out of rotation", "in rotation")


def test_dashboard_uses_sglang_0_5_23_names() -> None:
    wheel = find_sglang_wheel()
    if wheel is None:
        pytest.skip("the sglang 0.5.23 wheel is absent (make wheels)")
    used = {
        re.sub(r"_(bucket|sum|count)$", "", n) for e in _exprs() for n in re.findall(r"sglang:[a-z0-9_]+", e)
    }
    assert used and used <= set(wheel_metrics(wheel)), used - set(wheel_metrics(wheel))


class _GrafanaApi(BaseHTTPRequestHandler):
    dashboards: ClassVar[dict[str, dict[str, Any]]] = {}
    posts: ClassVar[list[dict[str, Any]]] = []

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._reply(401, {"message": "invalid API key"})
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorised():
            return
        uid = self.path.rsplit("/", 1)[-1]
        if uid in self.dashboards:
            self._reply(200, {"dashboard": self.dashboards[uid], "meta": {}})
        else:
            self._reply(404, {"message": "Dashboard not found"})

    def do_POST(self) -> None:
        if not self._authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.posts.append(body)
        dashboard = dict(body["dashboard"])
        version = self.dashboards.get(dashboard["uid"], {}).get("version", 0) + 1
        self.dashboards[dashboard["uid"]] = {**dashboard, "id": 7, "version": version}
        self._reply(200, {"id": 7, "uid": dashboard["uid"], "status": "success", "version": version})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def grafana():
    _GrafanaApi.dashboards, _GrafanaApi.posts = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GrafanaApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", _GrafanaApi
    server.shutdown()


@pytest.mark.slow
def test_dashboard_is_provisioned_once_and_the_token_never_logged(grafana, tmp_path: Path) -> None:
    url, api = grafana
    variables = tmp_path / "vars.json"
    variables.write_text(json.dumps({"monitoring_grafana_url": url, "monitoring_grafana_token": TOKEN,
                                     "monitoring_grafana_folder_uid": "pd"}))  # fmt: skip
    play = Path(__file__).parent / "grafana_play.yml"
    first = run_playbook(play, "inventory/rehearsal", "-e", f"@{variables}", "-v", timeout=300)
    assert first.returncode == 0, first.stdout[-3000:]
    assert len(api.posts) == 1
    sent = api.posts[0]
    assert sent["overwrite"] is True and sent["folderUid"] == "pd"
    assert sent["dashboard"] == json.loads(DASHBOARD.read_text())
    second = run_playbook(play, "inventory/rehearsal", "-e", f"@{variables}", "-v", timeout=300)
    assert second.returncode == 0, second.stdout[-3000:]
    assert len(api.posts) == 1, "an unchanged dashboard is not posted again"
    assert recap(second.stdout)["changed"] == 0, second.stdout[-3000:]
    for run in (first, second):
        assert TOKEN not in run.stdout + run.stderr


@pytest.mark.slow
def test_a_url_without_a_token_is_refused_before_any_call(grafana, tmp_path: Path) -> None:
    url, api = grafana
    play = Path(__file__).parent / "grafana_play.yml"
    done = run_playbook(
        play, "inventory/rehearsal", "-e", json.dumps({"monitoring_grafana_url": url}), timeout=300
    )
    assert done.returncode != 0 and "monitoring_grafana_token is empty" in done.stdout
    assert api.posts == []
