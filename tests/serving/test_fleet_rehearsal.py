"""A fleet of rehearsal hosts behind one router: hosts added and drained under load (issue 27).

Two, then three inventory hosts on this machine (ansible_connection local), each with its own
install root (its own supervisord) and its own ports: node-a runs a prefill, a decode and the
router, node-b and node-c a prefill and a decode each. playbooks/serve.yml converges them as it
would three lab hosts. An open-loop client (pd_appliance.bench.faults.measure: streamed chat
requests through the router) runs while node-c is added (a serve with it in the inventory: gated on
its own first, once with an impossible threshold, which keeps it out, then as shipped) and
while node-b is drained (playbooks/day2/drain.yml) and put back, and while node-c is retired
(a serve with serving_fleet_retire: [node-c]: drained, then its programs stopped); no request may fail and smg
(pd:router on node-a) must keep its pid throughout. Every process started is stopped at the end.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_appliance.bench.faults import LoadSpec, measure
from pd_appliance.serving import fleet
from pd_appliance.serving.apply import connect
from pd_testlib import ROOT, private_artifacts, reap, rehearsal_ports, reserve_ports, run_playbook

pytestmark = pytest.mark.slow

KEY = "fleet-rehearsal-key-41c7"
HOSTS = ("node-a", "node-b", "node-c")
RESULTS: dict[str, dict[str, Any]] = {}


@dataclass
class Fleet:
    base: Path
    inventory: Path
    router: str
    ports: dict[str, list[int]]
    seen_pids: set[int] = field(default_factory=set)
    converge_s: float = 0.0

    def root(self, host: str) -> Path:
        return self.base / host

    def hosts_file(self, hosts: tuple[str, ...]) -> None:
        pd = {h: {} for h in hosts}
        local = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
        groups = {"prefill": {"hosts": pd}, "decode": {"hosts": pd}, "router": {"hosts": {"node-a": {}}}}
        inventory = {"pd_appliance": {"children": groups, "hosts": {h: local for h in hosts}}}
        (self.inventory / "hosts.yml").write_text(yaml.safe_dump(inventory))

    def play(self, playbook: str, *extra: str) -> Any:
        result = run_playbook(playbook, self.inventory, *extra, timeout=900)
        self.pids("node-a")
        return result

    def pids(self, host: str) -> dict[str, int]:
        try:
            infos = connect(
                f"unix://{self.root(host)}/run/pd-appliance/supervisor.sock"
            ).supervisor.getAllProcessInfo()
        except OSError:
            return {}
        self.seen_pids |= {i["pid"] for i in infos if i["pid"]}
        return {i["name"]: int(i["pid"]) for i in infos if i["group"] == "pd" and i["statename"] == "RUNNING"}

    def urls(self, host: str) -> list[str]:
        return [f"http://127.0.0.1:{self.ports[host][0]}", f"http://127.0.0.1:{self.ports[host][2]}"]

    def stop(self) -> None:
        pids: set[int | None] = set(self.seen_pids)
        for host in HOSTS:
            self.pids(host)
            pidfile = self.root(host) / "run/pd-appliance/supervisord.pid"
            pids.add(int(pidfile.read_text()) if pidfile.exists() else None)
            conf = self.root(host) / "etc/pd-appliance/supervisor/supervisord.conf"
            if conf.exists():
                with contextlib.suppress(Exception):
                    connect(
                        f"unix://{self.root(host)}/run/pd-appliance/supervisor.sock"
                    ).supervisor.shutdown()
        reap(self.seen_pids | pids)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Fleet]:
    # A short base: each root's supervisor socket must fit an AF_UNIX path (conftest's inventory copy).
    base = Path(tempfile.mkdtemp(prefix="pdf-", dir="/tmp"))
    inventory = base / "inventory"
    shutil.copytree(ROOT / "inventory" / "rehearsal", inventory)
    shared = {
        **rehearsal_ports(), **private_artifacts(base), "serving_router_api_key": KEY,
        "appliance_tools_venv": sys.prefix, "appliance_router_venv": sys.prefix,
    }  # fmt: skip
    (inventory / "group_vars" / "all" / "zz-test-fleet.yml").write_text(yaml.safe_dump(shared))
    (inventory / "host_vars").mkdir()
    ports = {h: list(map(int, reserve_ports(3))) for h in HOSTS}
    for host in HOSTS:
        p, b, d = ports[host]
        host_vars = {
            "appliance_root": str(base / host),
            "serving_instances": [
                {"role": "prefill", "gpus": [0, 1, 2, 3], "tp_size": 4, "port": p, "bootstrap_port": b},
                {"role": "decode", "gpus": [4, 5, 6, 7], "tp_size": 4, "port": d},
            ],
        }
        (inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(host_vars))
    current = Fleet(base, inventory, f"http://127.0.0.1:{shared['serving_router_port']}", ports)
    try:
        current.hosts_file(HOSTS[:2])
        started = time.perf_counter()
        first = current.play("playbooks/serve.yml")
        current.converge_s = time.perf_counter() - started
        assert first.returncode == 0, first.stdout[-6000:]
        yield current
    finally:
        current.stop()
        shutil.rmtree(base, ignore_errors=True)


def registered(cluster: Fleet) -> set[str]:
    return {w.url for w in fleet.SmgWorkers(cluster.router, KEY).all()}


def test_two_hosts_serve_behind_one_router(cluster: Fleet) -> None:
    assert registered(cluster) == {*cluster.urls("node-a"), *cluster.urls("node-b")}
    assert set(cluster.pids("node-b")) == {"prefill", "decode"}


def host_gate_said(played: Any, host: str) -> str:
    """What the serve play's host gate (roles/serving/tasks/host_gate.yml) said of `host`, or ''."""
    found = re.search(rf"host gate: {re.escape(host)} (passed|FAILED)[^\"]*", " ".join(played.stdout.split()))
    return found.group(0) if found else ""


def test_a_joining_host_failing_its_own_gate_stays_out_and_the_router_serves(cluster: Fleet) -> None:
    router = cluster.pids("node-a")["router"]
    cluster.hosts_file(HOSTS)
    played: list[Any] = []

    def add() -> float:
        at = time.perf_counter()
        impossible = "serving_fleet_gate_min_output_tok_s=1000000"
        played.append(cluster.play("playbooks/serve.yml", "-e", impossible))
        return at

    span = cluster.converge_s * 1.5 + 20
    spec = LoadSpec(
        rate_rps=1, duration_s=span, fault_at_s=2, max_tokens=100, api="chat", request_timeout_s=120
    )
    result = measure(cluster.router, "dsv4-flash", spec, add, api_key=KEY)
    assert played[0].returncode != 0
    said = host_gate_said(played[0], "node-c")
    assert said.startswith("host gate: node-c FAILED: bs=1 ") and "threshold 1e+06 tok/s" in said, said
    assert result["failed"] == 0, result["errors"]
    assert cluster.pids("node-a")["router"] == router
    assert set(cluster.pids("node-c")) == {"prefill", "decode"}, "node-c was converged, only not listed"
    assert registered(cluster) == {*cluster.urls("node-a"), *cluster.urls("node-b")}


def test_a_host_added_under_load_fails_no_request_and_keeps_the_router(cluster: Fleet) -> None:
    router = cluster.pids("node-a")["router"]
    cluster.hosts_file(HOSTS)
    played: list[Any] = []

    def add() -> float:
        at = time.perf_counter()
        played.append(cluster.play("playbooks/serve.yml"))
        return at

    # The load spans the whole play (a first converge of two hosts took converge_s), 1 s answers.
    span = cluster.converge_s * 1.5 + 20
    spec = LoadSpec(
        rate_rps=1, duration_s=span, fault_at_s=2, max_tokens=100, api="chat", request_timeout_s=120
    )
    result = measure(cluster.router, "dsv4-flash", spec, add, api_key=KEY)
    assert played[0].returncode == 0, played[0].stdout[-6000:]
    assert host_gate_said(played[0], "node-c").startswith("host gate: node-c passed: bs=1 "), "no gate ran"
    RESULTS["add a host (serve with node-c in the inventory)"] = result
    assert result["failed"] == 0, result["errors"]
    assert cluster.pids("node-a")["router"] == router
    assert registered(cluster) == {u for h in HOSTS for u in cluster.urls(h)}


def test_a_host_drained_under_load_fails_no_request_and_comes_back(cluster: Fleet) -> None:
    router = cluster.pids("node-a")["router"]
    played: list[Any] = []

    busiest: list[float] = [0.0]

    def drain() -> float:
        at = time.perf_counter()
        done = threading.Event()

        def sample() -> None:  # what node-b's engines run while the play drains them
            while not done.wait(0.5):
                with contextlib.suppress(fleet.FleetError):
                    busiest[0] = max(busiest[0], sum(fleet.engine_running(u) for u in cluster.urls("node-b")))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            played.append(cluster.play("playbooks/day2/drain.yml", "-e", "host=node-b"))
        finally:
            done.set()
            sampler.join(timeout=10)
        return at

    # 6 s answers, longer than smg's 5 s settle: the play must wait for node-b's engines to go idle.
    spec = LoadSpec(
        rate_rps=1, duration_s=60, fault_at_s=3, max_tokens=600, api="chat", request_timeout_s=120
    )
    result = measure(cluster.router, "dsv4-flash", spec, drain, api_key=KEY)
    assert played[0].returncode == 0, played[0].stdout[-6000:]
    RESULTS["drain a host (day2/drain.yml)"] = result
    assert busiest[0] > 0, "nothing ran on node-b while it was drained: the test proves nothing"
    assert result["failed"] == 0, result["errors"]
    assert registered(cluster).isdisjoint(cluster.urls("node-b"))
    assert all(fleet.engine_running(u) == 0 for u in cluster.urls("node-b"))
    # Out of rotation across a later serve, and back with state=in.
    again = cluster.play("playbooks/serve.yml")
    assert again.returncode == 0, again.stdout[-6000:]
    assert registered(cluster).isdisjoint(cluster.urls("node-b"))
    back = cluster.play("playbooks/day2/drain.yml", "-e", "host=node-b", "-e", "state=in")
    assert back.returncode == 0, back.stdout[-6000:]
    assert registered(cluster) == {u for h in HOSTS for u in cluster.urls(h)}
    assert cluster.pids("node-a")["router"] == router
    status = cluster.play("playbooks/day2/status.yml")
    assert status.returncode == 0, status.stdout[-6000:]
    flat = " ".join(status.stdout.split())
    assert f"fleet: decode {cluster.urls('node-b')[1]} on node-b: in rotation, smg ready" in flat, flat[
        -4000:
    ]
    print_table()


def print_table() -> None:
    """The figures of the changes so far (benchmarks/results/fleet.md; printed with -s)."""
    shown = ("sent", "failed", "baseline_latency_s", "fault_s")
    table = {}
    for change, figures in RESULTS.items():
        longest = max(end - start for start, end, _ in figures["timeline"]["requests"])
        table[change] = {**{x: figures.get(x) for x in shown}, "longest_s": round(longest, 2)}
    print(json.dumps(table))


def busiest_while(cluster: Fleet, host: str, action: Any) -> float:
    """Run `action`, sampling what `host`'s engines run meanwhile; the most seen at once."""
    busiest = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal busiest
        while not done.wait(0.5):
            with contextlib.suppress(fleet.FleetError):
                busiest = max(busiest, sum(fleet.engine_running(u) for u in cluster.urls(host)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        action()
    finally:
        done.set()
        sampler.join(timeout=10)
    return busiest


def test_retiring_the_router_host_is_refused_before_any_change(cluster: Fleet) -> None:
    before = cluster.pids("node-a")
    refused = cluster.play("playbooks/serve.yml", "-e", json.dumps({"serving_fleet_retire": ["node-a"]}))
    assert refused.returncode != 0
    flat = " ".join(refused.stdout.split())
    refusal = "serving_fleet_retire=node-a: every host must be of the groups prefill or decode"
    assert refusal in flat, flat[-4000:]
    assert cluster.pids("node-a") == before
    assert registered(cluster) == {u for h in HOSTS for u in cluster.urls(h)}


def test_a_host_retired_in_one_serve_under_load_fails_no_request(cluster: Fleet) -> None:
    router = cluster.pids("node-a")["router"]
    assert set(cluster.pids("node-c")) == {"prefill", "decode"}
    retire = ("-e", json.dumps({"serving_fleet_retire": ["node-c"]}))
    played: list[Any] = []
    busiest: list[float] = []

    def serve() -> Any:
        return cluster.play("playbooks/serve.yml", *retire)

    def remove() -> float:
        at = time.perf_counter()
        busiest.append(busiest_while(cluster, "node-c", lambda: played.append(serve())))
        return at

    # 6 s answers (longer than smg's 5 s settle) over the whole serve play: node-c's engines hold
    # requests when it leaves the file, and the play must wait for them before it stops the programs.
    span = cluster.converge_s * 1.5 + 20
    spec = LoadSpec(
        rate_rps=1, duration_s=span, fault_at_s=3, max_tokens=600, api="chat", request_timeout_s=120
    )
    result = measure(cluster.router, "dsv4-flash", spec, remove, api_key=KEY)
    assert played[0].returncode == 0, played[0].stdout[-6000:]
    RESULTS["retire a host (serve with serving_fleet_retire: [node-c])"] = result
    assert busiest[0] > 0, "nothing ran on node-c while it was retired: the test proves nothing"
    assert result["failed"] == 0, result["errors"]
    assert cluster.pids("node-a")["router"] == router
    assert cluster.pids("node-c") == {}, "node-c's programs still run after it was retired"
    assert registered(cluster) == {*cluster.urls("node-a"), *cluster.urls("node-b")}
    listed = json.loads(next(cluster.root("node-a").rglob("router-workers.json")).read_text())
    assert {w["url"] for w in listed["workers"]} == {*cluster.urls("node-a"), *cluster.urls("node-b")}
    # The same play again: node-c's stopped engines count as idle, nothing starts on it.
    again = cluster.play("playbooks/serve.yml", *retire)
    assert again.returncode == 0, again.stdout[-6000:]
    assert cluster.pids("node-c") == {}
    assert cluster.pids("node-a")["router"] == router
    print_table()
