"""Rehearsal of multi-instance layouts: real supervisord, real smg, the rehearsal engine per instance.

playbooks/serve.yml converges inventory/rehearsal (a private appliance_root and free ports by -e, as
the other rehearsal tests do) to 1P TP2 + 3D TP2 on the 8 simulated GPUs, then to 2P TP2 + 2D TP2.
Requests go through the router; each instance's own request counter (sglang:num_requests_total on
its /metrics) shows every instance served its share. Day 2 restarts one instance by name. Every
process started is stopped at the end, also on failure.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving_testlib import Layouts, changed_count, post_json, private_deployment

pytestmark = pytest.mark.slow

REQUESTS = 24


class Layout(Layouts):
    def one_p_three_d(self) -> list[dict]:
        p = self.ports
        return [
            {"role": "prefill", "gpus": [0, 1], "tp_size": 2, "port": p[0], "bootstrap_port": p[1]},
            {"role": "decode", "gpus": [2, 3], "tp_size": 2, "port": p[2]},
            {"role": "decode", "gpus": [4, 5], "tp_size": 2, "port": p[3]},
            {"role": "decode", "gpus": [6, 7], "tp_size": 2, "port": p[4]},
        ]

    def two_p_two_d(self) -> list[dict]:
        p = self.ports
        return [
            {"role": "prefill", "gpus": [0, 1], "tp_size": 2, "port": p[0], "bootstrap_port": p[1]},
            {"role": "prefill", "gpus": [2, 3], "tp_size": 2, "port": p[5], "bootstrap_port": p[6]},
            {"role": "decode", "gpus": [4, 5], "tp_size": 2, "port": p[2]},
            {"role": "decode", "gpus": [6, 7], "tp_size": 2, "port": p[3]},
        ]

    def play(self, playbook: str, layout: list[dict] | None, **extra: object) -> subprocess.CompletedProcess:
        """Run a playbook on the deployment with `layout` as serving_instances (and more -e values);
        None leaves serving_instances to the inventory (a variant may set it)."""
        values = json.dumps(({"serving_instances": layout} if layout is not None else {}) | extra)
        return self.deployment.play(playbook, "-e", values)

    def converge(self, layout: list[dict]) -> subprocess.CompletedProcess:
        return self.play("playbooks/serve.yml", layout)


def requests_served(port: int) -> float:
    """sglang:num_requests_total of one instance, summed over its labels (streaming or not)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sglang:num_requests_total"
    )


def spread(layout: list[dict], names: list[str], router: str) -> dict[str, int]:
    """Send REQUESTS completions through the router, four at a time; requests each instance served."""
    before = {name: requests_served(inst["port"]) for name, inst in zip(names, layout, strict=True)}
    body = {"model": "dsv4-flash", "prompt": "The capital of France is", "max_tokens": 8}

    def one(_: int) -> int:
        return post_json(router + "/v1/completions", body, timeout=60)[0]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(one, range(REQUESTS)))
    assert statuses == [200] * REQUESTS, statuses
    return {
        name: int(requests_served(inst["port"]) - before[name])
        for name, inst in zip(names, layout, strict=True)
    }


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    # preflight (test_preflight_passes_the_layouts) checks the monitor stage's ports too.
    deployment, ports = private_deployment(tmp_path_factory.mktemp("topology"), 7)
    current = Layout(deployment, ports)
    try:
        deployment.first_run = current.converge(current.one_p_three_d())
        assert deployment.first_run.returncode == 0, deployment.first_run.stdout[-5000:]
        yield current
    finally:
        current.stop()


def test_one_prefill_three_decodes_each_serve_their_share(layout: Layout) -> None:
    names = ["prefill", "decode-0", "decode-1", "decode-2"]
    assert set(layout.pids()) == {*names, "router"}, layout.deployment.ctl("status").stdout
    served = spread(layout.one_p_three_d(), names, layout.deployment.router)
    print(f"1P TP2 + 3D TP2, {REQUESTS} requests through smg (round_robin): {served}")
    assert served["prefill"] == REQUESTS
    decodes = [served[n] for n in names[1:]]
    assert sum(decodes) == REQUESTS
    # Every decode instance served, and none starved: at least half of an even share each.
    assert min(decodes) >= REQUESTS / 3 / 2, served


def test_day2_status_and_restart_by_instance_name(layout: Layout) -> None:
    status = layout.play("playbooks/day2/status.yml", layout.one_p_three_d())
    assert status.returncode == 0, status.stdout[-4000:]
    for name in ("prefill", "decode-0", "decode-1", "decode-2", "router"):
        assert re.search(rf"pd:{name} RUNNING pid \d+ up \d+s \| health 200", status.stdout), status.stdout[
            -4000:
        ]
    before = layout.pids()
    restart = layout.play("playbooks/day2/restart.yml", layout.one_p_three_d(), day2_restart="decode-1")
    assert restart.returncode == 0, restart.stdout[-4000:]
    after = layout.pids()
    assert after["decode-1"] != before["decode-1"]
    assert {n: p for n, p in after.items() if n != "decode-1"} == {
        n: p for n, p in before.items() if n != "decode-1"
    }


def test_relayout_to_two_prefills_two_decodes_spreads_over_all_four(layout: Layout) -> None:
    """The new layout comes as a tuning variant (a topology is one of the things a variant may change):
    the serving role re-publishes the host's instances, so smg routes over the variant's four."""
    variant = {"name": "2p-tp2-2d-tp2", "vars": {"serving_instances": layout.two_p_two_d()}}
    router_before = layout.pids()["router"]
    result = layout.play("playbooks/serve.yml", None, serving_variant=variant)
    assert result.returncode == 0, result.stdout[-5000:]
    names = ["prefill-0", "prefill-1", "decode-0", "decode-1"]
    assert set(layout.pids()) == {*names, "router"}, layout.deployment.ctl("status").stdout
    # The fleet changed (a prefill added, a decode gone): smg's discovery file was rewritten and the
    # router kept running (its command line names only the file).
    assert layout.pids()["router"] == router_before
    listed = json.loads(
        (layout.deployment.root / "var/lib/pd-appliance/serving/router-workers.json").read_text()
    )
    assert sorted(w["url"] for w in listed["workers"]) == sorted(
        f"http://127.0.0.1:{inst['port']}" for inst in layout.two_p_two_d()
    )
    conf_d = layout.deployment.root / "etc/pd-appliance/supervisor/conf.d"
    assert not (conf_d / "decode-2.conf").exists() and not (conf_d / "prefill.conf").exists()
    served = spread(layout.two_p_two_d(), names, layout.deployment.router)
    print(f"2P TP2 + 2D TP2, {REQUESTS} requests through smg (round_robin): {served}")
    for role in ("prefill", "decode"):
        counts = [served[n] for n in names if n.startswith(role)]
        assert sum(counts) == REQUESTS and min(counts) >= REQUESTS / 2 / 2, served
    again = layout.play("playbooks/serve.yml", None, serving_variant=variant)
    assert again.returncode == 0 and changed_count(again) == 0, again.stdout[-5000:]


def test_preflight_passes_the_layouts(layout: Layout) -> None:
    """The same layouts pass preflight on the running deployment (its ports are its own programs')."""
    result = layout.play("playbooks/preflight.yml", layout.two_p_two_d())
    assert result.returncode == 0, result.stdout[-4000:]
    assert "preflight passed on localhost" in result.stdout


def test_a_drain_that_would_leave_no_decode_is_refused_before_anything_changes(layout: Layout) -> None:
    """playbooks/day2/drain.yml on the deployment's only PD host: refused, naming the way back, and
    its host state does not say out of rotation (a later serve would otherwise fail on it)."""
    pids = layout.pids()
    result = layout.deployment.play("playbooks/day2/drain.yml", "-e", "host=localhost")
    assert result.returncode != 0
    flat = " ".join(result.stdout.split())
    assert "with localhost out of rotation" in flat and "state=in" in flat, flat[-3000:]
    fact = layout.deployment.root / "etc/ansible/facts.d/pd_appliance.fact"
    assert "fleet" not in json.loads(fact.read_text())
    assert layout.pids() == pids
