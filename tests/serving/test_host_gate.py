"""A host's own bs=1 gate (pd_appliance.serving.host_gate): which hosts join and what they are gated
with, then the gate itself against the real smg 1.13.0 (the dev venv's, started by the product's
router_argv over the serving role's default router settings) and pd-sim-worker engines that require
the key, as the appliance's do: it passes, fails an impossible threshold, names a dead worker, one
smg never takes and a port in use, and leaves no private smg behind in any case.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_appliance.serving import discovery, host_gate
from pd_testlib import FAST_ENGINE_START, ROOT, reserve_ports, wait_http

BIN = Path(sys.executable).parent
KEY = "host-gate-test-key-93d0"


def published(host: str, role: str, port: int, bootstrap_port: int | None = None) -> dict[str, Any]:
    """One instance as pd_serving_topology publishes it."""
    return {"role": role, "name": role, "url": f"http://127.0.0.1:{port}", "bootstrap_port": bootstrap_port,
            "host": host}  # fmt: skip


def role_router_settings() -> dict[str, Any]:
    """The serving role's own router defaults (serving_router_* and serving_log_level, the templated
    ones left out), as the role hands them to the gate."""
    found: dict[str, Any] = {}
    for defaults in ("roles/appliance_defaults/defaults/main.yml", "roles/serving/defaults/main.yml"):
        for name, value in yaml.safe_load((ROOT / defaults).read_text()).items():
            if (name.startswith("serving_router_") or name == "serving_log_level") and "{{" not in str(value):
                found[name] = value
    return found


def test_a_host_joins_when_none_of_its_instances_is_in_the_file_and_it_is_not_out() -> None:
    fleet_ = [published("a", "prefill", 1, 8), published("a", "decode", 2), published("b", "prefill", 3, 9),
              published("b", "decode", 4), published("c", "decode", 5),
              published("d", "decode", 6)]  # fmt: skip
    listed = {"version": 1, "workers": [{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"}]}
    assert discovery.joining(fleet_, listed, out=["d"]) == ["b", "c"]
    # One instance still listed (a relayout of a host in rotation): not a join.
    assert discovery.joining(fleet_, {"workers": [*listed["workers"], {"url": "http://127.0.0.1:3"}]}) == [
        "c", "d"
    ]  # fmt: skip
    assert discovery.joining(fleet_, None) == [], "no file yet: a first deploy, the validate stage gates it"
    # A decode-only host is gated with the first in-rotation prefill; a whole host borrows nothing.
    assert discovery.companions(fleet_, listed, ["c"]) == [published("a", "prefill", 1, 8)]
    assert discovery.companions(fleet_, listed, ["b"]) == []
    assert discovery.companions(fleet_, {"workers": []}, ["c"]) == []


def test_the_file_as_the_play_found_it_is_none_only_when_there_is_none() -> None:
    listed = {"version": 1, "workers": [{"url": "http://127.0.0.1:1", "worker_type": "decode"}]}
    read = {"source": "/srv/f.json", "content": base64.b64encode(json.dumps(listed).encode()).decode()}
    assert discovery.listed_before(read, True) == listed
    assert discovery.listed_before({"source": "/srv/f.json"}, False) is None
    # Unreadable is not "no file": that would let a joining host in ungated.
    with pytest.raises(ValueError, match=r"/srv/f.json exists but could not be read: .*become"):
        discovery.listed_before({"source": "/srv/f.json"}, True)


def test_the_set_must_hold_a_prefill_and_a_decode_or_be_aggregated() -> None:
    decode = published("c", "decode", 5)
    assert "hold no prefill" in str(host_gate.set_problem([decode]))
    assert "__serving_gate_extra_instances" in str(host_gate.set_problem([decode]))
    assert host_gate.set_problem([published("a", "prefill", 1, 8), decode]) is None
    assert host_gate.set_problem([published("a", "aggregated", 1)]) is None
    assert "one mode" in str(host_gate.set_problem([published("a", "aggregated", 1), decode]))


def test_the_private_smg_is_the_product_argv_on_loopback_with_its_own_file_and_ports() -> None:
    spec = host_gate.GateSpec(
        [published("b", "prefill", 3, 9), published("b", "decode", 4)], ["/r/bin/smg", "launch"],
        role_router_settings(), port=7001, metrics_port=7002, api_key=KEY, threshold=1.0,
    )  # fmt: skip
    argv = host_gate.private_argv(spec, Path("/tmp/x/workers.json"))
    assert argv[:3] == ["/r/bin/smg", "launch", "--pd-disaggregation"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--discovery-file"] == "/tmp/x/workers.json"
    assert (flags["--host"], flags["--port"], flags["--prometheus-port"]) == ("127.0.0.1", "7001", "7002")
    assert flags["--policy"] == "round_robin" and KEY not in argv
    assert flags["--shutdown-grace-period-secs"] == "0", "nothing runs on it when it stops"


def gate_command_lines() -> dict[int, bytes]:
    """The command line of every live process of a gate: the gate itself, and its private smg (whose
    command line names the gate's temporary directory)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                line = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"pd-host-gate-" in line or b"pd_appliance.serving.host_gate" in line:
                found[int(proc.name)] = line
    return found


def gate_processes() -> list[int]:
    """Every live process whose command line names a gate's temporary directory (the private smg)."""
    return [pid for pid, line in gate_command_lines().items() if b"pd-host-gate-" in line]


def free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A prefill and a decode pd-sim-worker (40 ms to the first token, 10 ms a token) requiring the key."""
    tmp = tmp_path_factory.mktemp("host-gate")
    p, b, d, port, metrics = map(int, reserve_ports(5))
    env = dict(os.environ, **FAST_ENGINE_START, PD_SIM_TTFT_MS="40", PD_SIM_TPOT_MS="10")
    sim = [BIN / "pd-sim-worker", "--model-path", "simulated-model", "--served-model-name", "dsv4-flash",
           "--host", "127.0.0.1", "--api-key", KEY, "--enable-metrics"]  # fmt: skip
    cmds = [
        [*sim, "--port", p, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", b],
        [*sim, "--port", d, "--disaggregation-mode", "decode"],
    ]
    procs = []
    try:
        for n, cmd in enumerate(cmds):
            log = (tmp / f"engine-{n}.log").open("wb")
            procs.append(
                subprocess.Popen([str(c) for c in cmd], env=env, stdout=log, stderr=subprocess.STDOUT)
            )
        for port_ in (p, d):
            wait_http(f"http://127.0.0.1:{port_}/health")
        yield {
            "instances": [published("node-c", "prefill", p, b), published("node-c", "decode", d)],
            "port": port,
            "metrics_port": metrics,
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=40)


def spec_for(engines: dict[str, Any], **over: Any) -> host_gate.GateSpec:
    fields: dict[str, Any] = {
        "instances": engines["instances"], "router_command": [str(BIN / "smg"), "launch"],
        "settings": role_router_settings(), "port": engines["port"], "metrics_port": engines["metrics_port"],
        "api_key": KEY, "threshold": 20.0, "requests": 3, "output_len": 32, "timeout_s": 30.0,
        "model": "dsv4-flash",
    }  # fmt: skip
    return host_gate.GateSpec(**{**fields, **over})


def assert_no_private_smg(engines: dict[str, Any]) -> None:
    assert gate_processes() == [], "a private smg outlived its gate"
    assert free(engines["port"]) and free(engines["metrics_port"])


def test_the_gate_passes_through_a_private_smg_from_the_cli_and_stops_it(engines: dict[str, Any]) -> None:
    settings = role_router_settings()
    command = json.dumps([str(BIN / "smg"), "launch"])
    argv = [
        sys.executable, "-m", "pd_appliance.serving.host_gate", "--api-key-stdin",
        f"--instances={json.dumps(engines['instances'])}", f"--router-command={command}",
        f"--settings={json.dumps(settings)}", f"--port={engines['port']}",
        f"--metrics-port={engines['metrics_port']}", "--threshold=20", "--requests=3", "--output-len=32",
        "--timeout-s=30", "--model=dsv4-flash",
    ]  # fmt: skip
    gate = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert gate.stdin is not None
    gate.stdin.write(KEY + "\n")
    gate.stdin.close()
    # While it runs: the gate's processes (its own, the private smg's) never carry the key on a command line.
    seen: dict[int, bytes] = {}
    while gate.poll() is None:
        seen |= {pid: line for pid, line in gate_command_lines().items() if pid != os.getpid()}
        time.sleep(0.05)
    assert gate.stdout is not None and gate.stderr is not None  # one JSON line: the pipes never fill
    out, err = gate.stdout.read(), gate.stderr.read()
    assert gate.returncode == 0, out + err
    assert any(b"pd-host-gate-" in line for line in seen.values()), "the private smg was never seen"
    assert not [line for line in seen.values() if KEY.encode() in line], "the key was on a command line"
    result = json.loads(out.strip().splitlines()[-1])
    assert result["passed"] is True and result["error"] is None, result
    assert result["hosts"] == ["node-c"] and result["requests"] == 3 and result["threshold"] == 20.0
    assert result["instances"] == [i["url"] for i in engines["instances"]]
    # 32 tokens at 10 ms after 40 ms: about 90 tok/s; far above the 20 asked for, far below a 10x slip.
    assert 20.0 < result["output_tok_s"] < 200.0, result
    assert result["summary"].startswith(f"node-c passed: bs=1 {result['output_tok_s']:g} tok/s >= 20 ")
    assert_no_private_smg(engines)


def test_an_impossible_threshold_fails_naming_the_figure_and_stops_the_private_smg(
    engines: dict[str, Any],
) -> None:
    result = host_gate.run(spec_for(engines, threshold=1e6))
    assert result["passed"] is False and result["output_tok_s"] and result["output_tok_s"] > 20, result
    assert (
        f"bs=1 output throughput {result['output_tok_s']:.2f} tok/s < threshold 1000000.00" in result["error"]
    )
    failed = f"node-c FAILED: bs=1 {result['output_tok_s']:g} tok/s, threshold 1e+06"
    assert result["summary"].startswith(failed)
    assert_no_private_smg(engines)


def test_a_dead_worker_is_named_with_its_program_and_no_smg_starts(engines: dict[str, Any]) -> None:
    (dead,) = reserve_ports(1)  # reserved: nothing listens on it
    instances = [engines["instances"][0], {**published("node-d", "decode", dead), "name": "decode-1"}]
    result = host_gate.run(spec_for(engines, instances=instances))
    assert result["passed"] is False and result["hosts"] == ["node-c", "node-d"]
    assert f"decode http://127.0.0.1:{dead} (pd:decode-1 on node-d) does not answer" in result["error"]
    assert "`supervisorctl tail pd:decode-1` on node-d" in result["error"]
    assert_no_private_smg(engines)


def test_a_worker_smg_does_not_take_is_named_after_the_timeout_and_the_smg_stopped(
    engines: dict[str, Any],
) -> None:
    # Accepts connections, never answers: the dead-worker check passes it, smg's health probe does not.
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        port = mute.getsockname()[1]
        instances = [engines["instances"][0], published("node-d", "decode", port)]
        result = host_gate.run(spec_for(engines, instances=instances, timeout_s=4.0))
    assert result["passed"] is False
    assert (
        "the private smg did not take every worker in 4 s (serving_fleet_gate_timeout_s)" in result["error"]
    )
    assert f"decode http://127.0.0.1:{port} (pd:decode on node-d): not registered" in result["error"]
    assert "`supervisorctl tail pd:decode` on node-d" in result["error"]
    assert_no_private_smg(engines)


def test_a_port_in_use_is_named_with_its_variable(engines: dict[str, Any]) -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the earlier gates' TIME_WAIT
        taken.bind(("127.0.0.1", engines["port"]))
        taken.listen()
        result = host_gate.run(spec_for(engines))
    assert result["passed"] is False
    assert f"port {engines['port']} (serving_fleet_gate_port) is in use on the router host" in result["error"]
    assert_no_private_smg(engines)


def test_a_set_without_a_decode_is_refused_before_anything_starts(engines: dict[str, Any]) -> None:
    result = host_gate.run(spec_for(engines, instances=engines["instances"][:1]))
    assert result["passed"] is False and "hold no decode" in result["error"]
    assert_no_private_smg(engines)
