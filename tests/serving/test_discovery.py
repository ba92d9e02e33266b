"""smg's discovery file (pd_appliance.serving.discovery): its content, the check after a play, and a
fleet change through it against the real smg 1.13.0 and pd-sim-worker processes, started with the
router's command line as the appliance plans it (commands.router_argv).

Under open-loop load of streamed chat requests, a pair appended to the file is taken without a
router restart, and a pair dropped from it, drained (gone from GET /workers, its engines idle),
then SIGKILLed, loses no request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pd_appliance.bench.faults import LoadSpec, measure
from pd_appliance.serving import commands, discovery, fleet
from pd_testlib import FAST_ENGINE_START, reserve_ports, wait_http

BIN = Path(sys.executable).parent
KEY = "discovery-test-key-5e21"
FILE = "/srv/pd/router-workers.json"


def published(role: str, url: str, bootstrap_port: int | None = None) -> dict[str, object]:
    """One instance as pd_serving_topology publishes it (the fields the manifest reads)."""
    return {"role": role, "name": role, "url": url, "bootstrap_port": bootstrap_port, "host": "node1"}


def worker(url: str, worker_type: str, status: str = "ready", port: int | None = None) -> fleet.Worker:
    return fleet.Worker("id-" + url, url, worker_type, status, status == "ready", 0, port)


def test_the_manifest_lists_every_instance_with_its_type_and_bootstrap_port() -> None:
    pd = [published("prefill", "http://10.0.0.5:30000", 8998), published("decode", "http://10.0.0.6:30001")]
    assert discovery.manifest(pd) == {"version": 1, "workers": [
        {"url": "http://10.0.0.5:30000", "worker_type": "prefill", "bootstrap_port": 8998},
        {"url": "http://10.0.0.6:30001", "worker_type": "decode"},
    ]}  # fmt: skip
    agg = [published("aggregated", "http://10.0.0.5:30000"), published("aggregated", "http://10.0.0.5:30001")]
    assert [w["worker_type"] for w in discovery.manifest(agg)["workers"]] == ["regular", "regular"]
    # The command line's checks hold for the file: a prefill without its port, a missing role, two modes.
    with pytest.raises(commands.CommandError, match="no bootstrap port"):
        discovery.manifest([published("prefill", "http://x:1"), pd[1]])
    with pytest.raises(commands.CommandError, match="inventory groups"):
        discovery.manifest(pd[:1])
    with pytest.raises(commands.CommandError, match="one mode"):
        discovery.manifest([*pd, *agg])


def test_the_difference_names_each_worker_missing_extra_or_not_ready() -> None:
    listed = {"version": 1, "workers": [
        {"url": "http://a:1", "worker_type": "prefill", "bootstrap_port": 8998},
        {"url": "http://b:2", "worker_type": "decode"},
    ]}  # fmt: skip
    same = [worker("http://a:1", "prefill", port=8998), worker("http://b:2", "decode")]
    assert discovery.difference(listed, same) == []
    assert discovery.difference(listed, same[:1]) == ["listed in the file, not registered: decode http://b:2"]
    assert discovery.difference(listed, [*same, worker("http://c:3", "decode", "draining")]) == [
        "registered (draining), not in the file: decode http://c:3"
    ]
    assert discovery.difference(listed, [same[0], worker("http://b:2", "decode", "pending")]) == [
        "listed, not ready yet: decode http://b:2 (pending)"
    ]
    # Another bootstrap port is another worker to smg: both sides are named.
    moved = [worker("http://a:1", "prefill", port=9000), same[1]]
    assert discovery.difference(listed, moved) == [
        "listed in the file, not registered: prefill http://a:1 (bootstrap 8998)",
        "registered (ready), not in the file: prefill http://a:1 (bootstrap 9000)",
    ]
    assert discovery.without(listed, ["http://a:1"])["workers"] == listed["workers"][1:]


def test_a_stopped_engine_counts_as_idle_only_for_a_retired_host() -> None:
    (port,) = reserve_ports(1)  # reserved, nothing listens: the connection is refused
    url = f"http://127.0.0.1:{port}"
    assert discovery.running_or_stopped(url) == 0.0
    assert discovery.idle([url], 1.0, 0.1, stopped_is_idle=True) < 0.1  # settled at the first look
    # A drained (not retired) engine that does not answer is an error, as before.
    with pytest.raises(fleet.FleetError, match="Connection refused"):
        discovery.idle([url], 1.0, 0.1)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[dict[str, object]]:
    """smg started by the product's router_argv (file discovery) over pair 1; pair 2 running, not
    listed. Workers require the key, as the appliance's do."""
    p1, b1, d1, p2, b2, d2, port, metrics = map(int, reserve_ports(8))
    env = dict(os.environ, **FAST_ENGINE_START, PD_SIM_TTFT_MS="40", PD_SIM_TPOT_MS="10")
    sim = [BIN / "pd-sim-worker", "--model-path", "simulated-model", "--served-model-name", "dsv4-flash",
           "--host", "127.0.0.1", "--api-key", KEY, "--enable-metrics"]  # fmt: skip
    cmds = {
        "p1": [*sim, "--port", p1, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", b1],
        "d1": [*sim, "--port", d1, "--disaggregation-mode", "decode"],
        "p2": [*sim, "--port", p2, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", b2],
        "d2": [*sim, "--port", d2, "--disaggregation-mode", "decode"],
    }
    pair1 = [
        published("prefill", f"http://127.0.0.1:{p1}", b1),
        published("decode", f"http://127.0.0.1:{d1}"),
    ]
    pair2 = [
        published("prefill", f"http://127.0.0.1:{p2}", b2),
        published("decode", f"http://127.0.0.1:{d2}"),
    ]
    path = tmp_path / "router-workers.json"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, cmd in cmds.items():
            log = (tmp_path / f"{name}.log").open("wb")
            procs[name] = subprocess.Popen(
                [str(c) for c in cmd], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        for p in (p1, d1, p2, d2):
            wait_http(f"http://127.0.0.1:{p}/health")
        discovery.write(path, discovery.manifest(pair1))
        settings = {
            "prefill": pair1[:1], "decode": pair1[1:], "discovery_file": str(path), "host": "127.0.0.1",
            "port": port, "policy": "round_robin", "prometheus_host": "127.0.0.1", "prometheus_port": metrics,
            "health_check_interval_secs": 1, "circuit_breaker": False, "remove_unhealthy_workers": False,
        }  # fmt: skip
        argv = [*commands.router_argv([str(BIN / "smg"), "launch"], settings), "--api-key", KEY]
        log = (tmp_path / "router.log").open("wb")
        procs["router"] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{port}/readiness")
        yield {
            "url": f"http://127.0.0.1:{port}",
            "path": path,
            "pair1": pair1,
            "pair2": pair2,
            "procs": procs,
        }
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=40)


@pytest.mark.slow
def test_a_pair_added_and_drained_through_the_file_loses_no_request_and_keeps_the_router(
    router: dict,
) -> None:
    url, path = str(router["url"]), Path(router["path"])
    workers = fleet.SmgWorkers(url, KEY)
    smg = router["procs"]["router"]
    both = discovery.manifest([*router["pair1"], *router["pair2"]])
    assert discovery.check(workers, json.loads(path.read_text()), timeout_s=20) >= 0
    # A wrong file is named by the check: what the file lists that smg never took.
    with pytest.raises(fleet.FleetError, match="listed in the file, not registered: decode"):
        discovery.check(workers, both, timeout_s=0.5)

    def add() -> float:
        at = time.perf_counter()
        discovery.write(path, both)
        discovery.check(workers, both, timeout_s=20)
        return at

    spec = LoadSpec(rate_rps=5, duration_s=4, fault_at_s=2, max_tokens=100, api="chat", request_timeout_s=60)
    added = measure(url, "dsv4-flash", spec, add, api_key=KEY)
    assert added["failed"] == 0, added["errors"]
    assert smg.poll() is None, "the router stopped: a fleet change must not restart it"

    engines = [str(w["url"]) for w in router["pair2"]]
    busy: list[float] = []

    def drain_and_stop() -> float:
        at = time.perf_counter()
        busy.append(fleet.engine_running(engines[1]))
        discovery.write(path, discovery.without(both, engines))
        discovery.drain(workers, engines, timeout_s=60)
        for name in ("p2", "d2"):
            router["procs"][name].kill()  # the worst stop: nothing finishes after it
        return at

    # 7 s answers, longer than smg's 5 s settle: only the wait for idle engines keeps them.
    spec = LoadSpec(rate_rps=3, duration_s=5, fault_at_s=3, max_tokens=700, api="chat", request_timeout_s=60)
    drained = measure(url, "dsv4-flash", spec, drain_and_stop, api_key=KEY)
    assert busy[0] > 0, "nothing ran on the pair when it was drained: the test proves nothing"
    assert drained["failed"] == 0, drained["errors"]
    assert drained["served_after"] > 0
    assert discovery.check(workers, json.loads(path.read_text()), timeout_s=5) >= 0
    assert smg.poll() is None
    print(f"add: {added['sent']} sent, {added['failed']} failed; drain: {drained['sent']} sent, "
          f"{drained['failed']} failed, change took {drained['fault_s']} s")  # fmt: skip


def test_hosts_out_of_rotation_leave_the_file_and_status_says_where_each_worker_stands() -> None:
    fleet_ = [
        {**published("prefill", "http://10.0.0.5:30000", 8998), "host": "node1"},
        {**published("decode", "http://10.0.0.5:30001"), "host": "node1"},
        {**published("decode", "http://10.0.0.6:30001"), "host": "node2"},
    ]
    states = {"node1": {"release": {"current": "r1"}}, "node2": {"fleet": {"rotation": "out"}}, "node3": None}
    out = discovery.out_of_rotation(states)
    assert out == ["node2"]
    assert [w["url"] for w in discovery.manifest(fleet_, out)["workers"]] == [
        "http://10.0.0.5:30000", "http://10.0.0.5:30001"
    ]  # fmt: skip
    # Draining the last decode host is refused, naming the hosts out and the way back.
    with pytest.raises(commands.CommandError, match=r"with node1, node2 out of rotation: .*state=in"):
        discovery.manifest(fleet_, ["node1", "node2"])
    registered = [
        {"url": "http://10.0.0.5:30000", "worker_type": "prefill", "status": "ready", "load": 2},
        {"url": "http://10.0.0.5:30001", "worker_type": "decode", "status": "ready", "load": 1},
        {"url": "http://10.0.0.6:30001", "worker_type": "decode", "status": "draining", "load": 3},
    ]
    assert discovery.fleet_lines(registered, fleet_, states) == [
        "prefill http://10.0.0.5:30000 on node1: in rotation, smg ready, load 2, release r1",
        "decode http://10.0.0.5:30001 on node1: in rotation, smg ready, load 1, release r1",
        "decode http://10.0.0.6:30001 on node2: draining, smg draining, load 3, no release recorded",
    ]
    assert discovery.fleet_lines(registered[:1], fleet_, states)[1:] == [
        "http://10.0.0.5:30001 on node1: NOT REGISTERED by smg, release r1",
        "http://10.0.0.6:30001 on node2: out of rotation (drained), no release recorded",
    ]
