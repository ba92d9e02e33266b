"""Aggregated replicas in rehearsal: real supervisord, real smg 1.13 in its regular mode, the rehearsal
engine without --disaggregation-mode (prefill and decode in one engine).

playbooks/serve.yml converges inventory/rehearsal (a private appliance_root and reserved ports by -e)
to two aggregated TP4 instances on the 8 simulated GPUs. A streamed request goes through the router;
each engine reports itself unified on its /metrics and counts what it served; the appliance's
readiness sees smg's regular workers. The monitor stage renders one scrape target per instance and
the router alert for the one worker type. Then a tuning variant switches the host to PD (1P TP4 + 1D
TP4) and back, as the tuner does: smg changes mode, the dropped programs go, and a second run changes
nothing. Every process started is stopped at the end, also on failure.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from serving_testlib import API_KEY, Layouts, changed_count, post_json, private_deployment
from supervisor.options import UnhosedConfigParser

pytestmark = pytest.mark.slow

REQUESTS = 12
CONF_D = "etc/pd-appliance/supervisor/conf.d"
# smg's discovery file (serving_router_discovery_file): the router's workers, written by the play.
WORKERS_FILE = "var/lib/pd-appliance/serving/router-workers.json"


class Aggregated(Layouts):
    def layout(self) -> list[dict]:
        p = self.ports
        return [
            {"role": "aggregated", "gpus": [0, 1, 2, 3], "tp_size": 4, "port": p[0]},
            {"role": "aggregated", "gpus": [4, 5, 6, 7], "tp_size": 4, "port": p[1]},
        ]

    def pd(self) -> list[dict]:
        p = self.ports
        return [
            {"role": "prefill", "gpus": [0, 1, 2, 3], "tp_size": 4, "port": p[2], "bootstrap_port": p[3]},
            {"role": "decode", "gpus": [4, 5, 6, 7], "tp_size": 4, "port": p[4]},
        ]

    def play(self, playbook: str, **extra: object) -> subprocess.CompletedProcess:
        return self.deployment.play(playbook, "-e", json.dumps(extra))

    def command(self, program: str) -> list[str]:
        parser = UnhosedConfigParser()
        parser.read_string((self.deployment.root / CONF_D / f"{program}.conf").read_text())
        return shlex.split(parser.get(f"program:{program}", "command"))


def served(port: int) -> dict[str, float]:
    """sglang:num_requests_total of one engine by engine_type (streaming or not summed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sglang:num_requests_total":
                kind = sample.labels.get("engine_type", "")
                out[kind] = out.get(kind, 0.0) + sample.value
    return out


def stream(router: str) -> tuple[int, list[dict]]:
    """One streamed completion through the router: (status, the data events before [DONE])."""
    body = {"model": "dsv4-flash", "prompt": "The capital of France is", "max_tokens": 8, "stream": True}
    request = urllib.request.Request(
        router + "/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )  # fmt: skip
    events = []
    with urllib.request.urlopen(request, timeout=60) as response:
        status = response.status
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
    return status, events


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory):
    deployment, ports = private_deployment(tmp_path_factory.mktemp("aggregated"), 5)
    current = Aggregated(deployment, ports)
    try:
        # The inventory's serving_instances stays the lab's PD default: the aggregated layout is a
        # variant, as the tuner applies one (an -e serving_instances would outrank any later variant).
        variant = {"name": "agg-2x-tp4", "vars": {"serving_instances": current.layout()}}
        deployment.first_run = current.play("playbooks/serve.yml", serving_variant=variant)
        assert deployment.first_run.returncode == 0, deployment.first_run.stdout[-5000:]
        yield current
    finally:
        current.stop()


def test_two_aggregated_engines_serve_a_streamed_request_through_smg_regular_mode(
    aggregated: Aggregated,
) -> None:
    names = ["aggregated-0", "aggregated-1"]
    assert set(aggregated.pids()) == {*names, "router"}, aggregated.deployment.ctl("status").stdout
    for name in names:
        argv = aggregated.command(name)
        assert not [w for w in argv if w.startswith("--disaggregation")], argv
        assert argv[argv.index("--tp-size") + 1] == "4" and "--cuda-graph-max-bs-decode" in argv
    smg = aggregated.command("router")
    smg = smg[smg.index("--") + 1 :]
    urls = [f"http://127.0.0.1:{inst['port']}" for inst in aggregated.layout()]
    workers_file = aggregated.deployment.root / WORKERS_FILE
    assert smg[2:6] == ["--discovery-provider", "file", "--discovery-file", str(workers_file)], smg
    assert json.loads(workers_file.read_text())["workers"] == [
        {"url": url, "worker_type": "regular"} for url in urls
    ]
    assert "--pd-disaggregation" not in smg and smg[smg.index("--policy") + 1] == "cache_aware"
    assert "--pd-admission-wait-secs" not in smg

    before = {inst["port"]: served(inst["port"]) for inst in aggregated.layout()}
    status, events = stream(aggregated.deployment.router)
    assert status == 200 and len(events) >= 2, events
    assert "".join(e["choices"][0]["text"] for e in events).strip()
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    body = {"model": "dsv4-flash", "prompt": "Count to three:", "max_tokens": 4}
    for _ in range(REQUESTS - 1):
        assert post_json(aggregated.deployment.router + "/v1/completions", body, timeout=60)[0] == 200
    after = {inst["port"]: served(inst["port"]) for inst in aggregated.layout()}
    # Each engine is one unified engine (no prefill/decode series); together they served every request.
    assert all(set(a) == {"unified"} for a in after.values()), after
    total = sum(after[p]["unified"] - before[p].get("unified", 0.0) for p in after)
    assert total == REQUESTS, (before, after)


def test_readiness_day2_and_monitoring_cover_aggregated_instances(aggregated: Aggregated) -> None:
    ready = subprocess.run(
        [sys.executable, "-m", "pd_appliance.serving.readiness", "--router", aggregated.deployment.router,
         "--api-key-stdin", "--wait-s", "30"],
        input=API_KEY + "\n", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    verdict = json.loads(ready.stdout)
    assert ready.returncode == 0 and verdict["reason"] == "ready", ready.stdout + ready.stderr
    assert sorted(w["worker_type"] for w in verdict["workers"]) == ["regular", "regular"]

    # Day-2 plays and the monitor stage read the inventory's layout (the facts play), not a variant:
    # the layout running is given to them as the inventory would (tests/serving/test_topology_rehearsal).
    layout = aggregated.layout()
    status = aggregated.play("playbooks/day2/status.yml", serving_instances=layout)
    assert status.returncode == 0, status.stdout[-4000:]
    for name in ("aggregated-0", "aggregated-1", "router"):
        assert re.search(rf"pd:{name} RUNNING pid \d+ up \d+s \| health 200", status.stdout), status.stdout[
            -4000:
        ]
    before = aggregated.pids()
    restart = aggregated.play(
        "playbooks/day2/restart.yml", serving_instances=layout, day2_restart="aggregated-1"
    )
    assert restart.returncode == 0, restart.stdout[-4000:]
    after = aggregated.pids()
    assert after["aggregated-1"] != before["aggregated-1"]
    assert {n: p for n, p in after.items() if n != "aggregated-1"} == {
        n: p for n, p in before.items() if n != "aggregated-1"
    }

    # The monitor stage (render only) scrapes both engines and alerts on the one worker type smg has.
    rendered = aggregated.play("playbooks/monitor.yml", serving_instances=layout, monitoring_render_only=True)
    assert rendered.returncode == 0, rendered.stdout[-4000:]
    monitoring = aggregated.deployment.root / "etc/pd-appliance/monitoring"
    config = yaml.safe_load((monitoring / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    targets = [
        (c["targets"], c["labels"]["role"], c["labels"]["pd_instance"])
        for c in jobs["sglang"]["static_configs"]
    ]
    assert targets == [
        ([f"127.0.0.1:{inst['port']}"], "aggregated", f"aggregated-{i}")
        for i, inst in enumerate(aggregated.layout())
    ]
    rules = yaml.safe_load((monitoring / "rules/pd-appliance.rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert "PDRouterNoAvailableAggregated" in alerts
    assert not alerts & {"PDRouterNoAvailablePrefill", "PDRouterNoAvailableDecode"}


def test_a_variant_switches_between_aggregated_and_pd_and_the_router_follows(aggregated: Aggregated) -> None:
    conf_d = aggregated.deployment.root / CONF_D
    pd = {"name": "pd-1p4-1d4", "vars": {"serving_instances": aggregated.pd()}}
    result = aggregated.play("playbooks/serve.yml", serving_variant=pd)
    assert result.returncode == 0, result.stdout[-5000:]
    assert set(aggregated.pids()) == {"prefill", "decode", "router"}, aggregated.deployment.ctl(
        "status"
    ).stdout
    assert not list(conf_d.glob("aggregated*.conf")) and not list(
        conf_d.parent.parent.glob("serving/aggregated*")
    )
    smg = aggregated.command("router")
    assert "--pd-disaggregation" in smg and "--discovery-provider" in smg
    assert smg[smg.index("--policy") + 1] == "round_robin"  # serving_router_policy, PD mode's
    workers_file = aggregated.deployment.root / WORKERS_FILE
    assert [w["worker_type"] for w in json.loads(workers_file.read_text())["workers"]] == [
        "prefill",
        "decode",
    ]
    status, events = stream(aggregated.deployment.router)
    assert status == 200 and events

    back = {"name": "agg-2x-tp4", "vars": {"serving_instances": aggregated.layout()}}
    result = aggregated.play("playbooks/serve.yml", serving_variant=back)
    assert result.returncode == 0, result.stdout[-5000:]
    assert set(aggregated.pids()) == {"aggregated-0", "aggregated-1", "router"}
    assert not (conf_d / "prefill.conf").exists() and not (conf_d / "decode.conf").exists()
    assert "--pd-disaggregation" not in aggregated.command("router")
    assert {w["worker_type"] for w in json.loads(workers_file.read_text())["workers"]} == {"regular"}
    status, events = stream(aggregated.deployment.router)
    assert status == 200 and events
    again = aggregated.play("playbooks/serve.yml", serving_variant=back)
    assert again.returncode == 0 and changed_count(again) == 0, again.stdout[-5000:]


def test_preflight_passes_the_aggregated_layout_and_refuses_a_mix(aggregated: Aggregated) -> None:
    result = aggregated.play("playbooks/preflight.yml", serving_instances=aggregated.layout())
    assert result.returncode == 0, result.stdout[-4000:]
    assert "preflight passed on localhost" in result.stdout
    mixed = [aggregated.layout()[0], aggregated.pd()[1]]
    refused = aggregated.play("playbooks/preflight.yml", serving_instances=mixed)
    assert refused.returncode != 0
    assert "serving_instances mixes aggregated instances (pd:aggregated) with prefill/decode instances" in (
        refused.stdout
    ), refused.stdout[-4000:]
