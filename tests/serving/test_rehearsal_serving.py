"""Rehearsal: the serving role converges real supervisord + real smg + two pd-sim-worker programs.

One converge of playbooks/serve.yml against inventory/rehearsal (private appliance_root and free
ports, the test's venv as tools and router venv), then: requests through the router, a second
converge that changes nothing, an env-hook change that restarts pd:decode alone, and a SIGKILLed
worker that supervisor restarts and the router serves through again. Every process started is
stopped at the end, also on failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from serving_testlib import Deployment, changed_count, post_json, private_deployment

from pd_standins.engine import TRACE_STAND_IN
from pd_standins.nvml import STAND_IN
from pd_testlib import run_playbook
from rehearsal_deployment import PD_PORTS

pytestmark = pytest.mark.slow

RESTART_BOUND_S = 45.0


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    dep, _ = private_deployment(tmp_path_factory.mktemp("rehearsal"), named_ports=PD_PORTS)
    try:
        dep.first_run = dep.converge()
        assert dep.first_run.returncode == 0, dep.first_run.stdout[-5000:]
        yield dep
    finally:
        dep.stop()


def test_first_converge_runs_all_three_programs(deployment: Deployment) -> None:
    assert set(deployment.pids()) == {"prefill", "decode", "router"}
    # The YAML callback folds a long message over lines: compare with whitespace collapsed.
    said = " ".join(deployment.first_run.stdout.split())
    assert f"STAND-IN ({STAND_IN}): pinning uses the GPU stand-in" in said
    status = deployment.ctl("status").stdout
    assert status.count("RUNNING") == 3, status


def test_the_serve_stage_records_what_each_engine_chose_from_its_log(deployment: Deployment) -> None:
    state = deployment.root / "var/lib/pd-appliance/engine-startup"
    records = {name: json.loads((state / f"{name}.json").read_text()) for name in ("prefill", "decode")}
    for name, record in records.items():
        assert record["program"] == f"pd:{name}" and record["fallbacks"] == [], record
        assert record["choices"]["disaggregation_mode"] == name
        assert (record["choices"]["transfer_backend"], record["choices"]["nixl_backend"]) == ("nixl", "UCX")
        assert record["choices"]["moe_runner_backend"] == "flashinfer_cutlass"
        assert record["env"]["UCX_TLS"]  # what the engine process was started with
    assert records["decode"]["choices"]["cuda_graph_bs"][-1] == 32  # serving_decode_cuda_graph_max_bs
    assert "cuda_graph_bs" not in records["prefill"]["choices"]


def test_requests_through_the_router_reach_the_simulated_pd_pair(deployment: Deployment) -> None:
    status, headers, raw = post_json(
        deployment.router + "/v1/chat/completions",
        {"model": "dsv4-flash", "messages": [{"role": "user", "content": "The capital of France is"}],
         "max_tokens": 16},
    )  # fmt: skip
    assert status == 200, raw
    body = json.loads(raw)
    assert "Paris" in body["choices"][0]["message"]["content"]
    simulator = {k.lower(): v for k, v in headers.items()}["x-pd-simulator"]
    assert "pd-sim-worker" in simulator and "role=decode" in simulator
    status, _, raw = post_json(
        deployment.router + "/v1/completions",
        {"model": "dsv4-flash", "prompt": "Hello", "max_tokens": 32, "ignore_eos": True, "stream": True,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 32


def test_second_converge_reports_no_change(deployment: Deployment) -> None:
    pids = deployment.pids()
    second = deployment.converge()
    assert second.returncode == 0, second.stdout[-4000:]
    assert changed_count(second) == 0, second.stdout[-6000:]
    assert deployment.pids() == pids


def test_decode_env_hook_restarts_decode_alone(deployment: Deployment) -> None:
    before = deployment.pids()
    hook = 'a, "quoted" value with spaces'
    result = deployment.converge("-e", json.dumps({"serving_env_decode": {"PD_TEST_HOOK": hook}}))
    assert result.returncode == 0, result.stdout[-4000:]
    after = deployment.pids()
    assert after["decode"] != before["decode"]
    assert after["prefill"] == before["prefill"] and after["router"] == before["router"]
    environ = Path(f"/proc/{after['decode']}/environ").read_bytes().split(b"\0")
    assert f"PD_TEST_HOOK={hook}".encode() in environ
    assert b"CUDA_VISIBLE_DEVICES=4,5,6,7" in environ


def test_sigkilled_worker_is_restarted_and_served_through_again(deployment: Deployment) -> None:
    before = deployment.pids()
    os.kill(before["prefill"], signal.SIGKILL)
    killed_at = time.monotonic()
    restarted = None
    while time.monotonic() - killed_at < RESTART_BOUND_S:
        pid = deployment.pids().get("prefill")
        if pid and pid != before["prefill"]:
            restarted = time.monotonic() - killed_at
            break
        time.sleep(0.2)
    assert restarted is not None, deployment.ctl("status").stdout
    served = None
    while time.monotonic() - killed_at < RESTART_BOUND_S:
        probe = {"model": "dsv4-flash", "prompt": "The capital of France is", "max_tokens": 4}
        status, _, raw = post_json(deployment.router + "/v1/completions", probe)
        if status == 200 and b"Paris" in raw:
            served = time.monotonic() - killed_at
            break
        time.sleep(0.5)
    assert served is not None, f"router did not serve within {RESTART_BOUND_S}s of the SIGKILL"
    print(f"prefill restarted after {restarted:.1f}s; router served again after {served:.1f}s")


def _day2(deployment: Deployment, playbook: str, *extra: str) -> subprocess.CompletedProcess:
    args = ("-e", f"@{deployment.vars_file}", *extra)
    result = run_playbook(f"playbooks/day2/{playbook}", "inventory/rehearsal", *args, timeout=600)
    assert result.returncode == 0, result.stdout[-5000:]
    return result


def test_day2_status_restart_and_profile(deployment: Deployment) -> None:
    status = _day2(deployment, "status.yml").stdout
    assert status.count("RUNNING pid") == 3 and status.count("| health 200") == 3
    assert re.search(r"no\s+nvidia-smi\s+on\s+this\s+host", status)
    before = deployment.pids()
    _day2(deployment, "restart.yml", "-e", "day2_restart=decode")
    after = deployment.pids()
    assert after["decode"] != before["decode"]
    assert (after["prefill"], after["router"]) == (before["prefill"], before["router"])
    profile = _day2(deployment, "profile.yml").stdout
    # Ansible's YAML callback wraps the long STAND-IN line: compare with whitespace collapsed.
    flat = " ".join(profile.split())
    assert f"STAND-IN ({TRACE_STAND_IN}): these traces are not GPU measurements" in flat
    assert re.search(r"in\s+2\s+trace\(s\)", profile)
    assert "simulated_sparse_decode_kernel" in profile


def test_day2_collect_diagnostics(deployment: Deployment, tmp_path: Path) -> None:
    import tarfile

    _day2(deployment, "collect-diagnostics.yml", "-e", f"day2_diagnostics_local_dir={tmp_path}")
    bundles = list(tmp_path.glob("pd-diagnostics-localhost-*.tar.gz"))
    assert len(bundles) == 1
    with tarfile.open(bundles[0]) as tar:
        names = set(tar.getnames())
    expected = {"config/supervisor/conf.d/decode.conf", "logs/router.log", "nvml-facts.json",
                "pip-freeze-sglang.txt", "state.txt"}  # fmt: skip
    assert {f"diagnostics/{name}" for name in expected} <= names
