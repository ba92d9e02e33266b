"""The client through the real router: smg 1.13.0 in PD mode in front of two pd-sim-worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pd_appliance.bench.runner import measure_sync, plan_from_lists
from pd_testlib import FAST_ENGINE_START, reserve_ports, wait_http

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
SIM_TTFT_MS, SIM_TPOT_MS = 30.0, 4.0


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The router in front of a prefill/decode pair, and (the reference) one worker alone, no PD."""
    if not (BIN / "smg").exists() or not (BIN / "pd-sim-worker").exists():
        pytest.fail(f"smg and pd-sim-worker must be installed in {BIN} (pip install -e '.[dev]')")
    logs = tmp_path_factory.mktemp("smg")
    prefill, decode, bootstrap, router, metrics, alone = reserve_ports(6)
    env = dict(
        os.environ,
        **FAST_ENGINE_START,
        PD_SIM_TTFT_MS=str(SIM_TTFT_MS),
        PD_SIM_TPOT_MS=str(SIM_TPOT_MS),
        PD_SIM_CANNED_COMPLETIONS_JSON=json.dumps({"The capital of France is": " Paris."}),
    )
    sim = [BIN / "pd-sim-worker", "--model-path", "simulated-model", "--served-model-name", "dsv4-flash",
           "--host", "127.0.0.1"]  # fmt: skip
    router_args = f"""
        launch --pd-disaggregation --policy round_robin
        --prefill http://127.0.0.1:{prefill} {bootstrap} --decode http://127.0.0.1:{decode}
        --host 127.0.0.1 --port {router} --health-check-interval-secs 1
        --prometheus-host 127.0.0.1 --prometheus-port {metrics}
    """.split()
    cmds = {
        "prefill": [
            *sim,
            "--port",
            prefill,
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            bootstrap,
        ],
        "decode": [*sim, "--port", decode, "--disaggregation-mode", "decode"],
        "alone": [*sim, "--port", alone],
        "router": [BIN / "smg", *router_args],
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, cmd in cmds.items():
            if name == "router":
                wait_http(f"http://127.0.0.1:{prefill}/health")
                wait_http(f"http://127.0.0.1:{decode}/health")
            log = (logs / f"{name}.log").open("wb")
            procs.append(
                subprocess.Popen([str(c) for c in cmd], env=env, stdout=log, stderr=subprocess.STDOUT)
            )
        yield {"router": f"http://127.0.0.1:{router}", "alone": f"http://127.0.0.1:{alone}"}
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_probe_and_figures_through_smg(urls: dict[str, str], api: str) -> None:
    plan = plan_from_lists(urls["router"], [1, 8], [4, 16], 64, 32, None, api, 30.0, ready_timeout_s=60)
    result = measure_sync(plan, keep_records=True)
    # The reference, on this machine now: the same client at bs=1 against one worker, no router.
    alone = plan_from_lists(urls["alone"], [1], [4], 64, 32, None, api, 30.0, ready_timeout_s=60)
    reference = measure_sync(alone)["phases"][0]["tpot_ms"]["p50"]
    assert result["ready"]["ready"] is True and result["ready"]["path"] == "/readiness"
    assert result["probe"]["passed"] is True, result["probe"]
    assert result["model"] == "dsv4-flash"
    bs1, c8 = result["phases"]
    for phase in (bs1, c8):
        assert phase["errors"] == 0, phase["error_samples"]
        assert phase["token_count_source"] == "usage"
        assert phase["output_tokens"] == phase["requests"] * 32
    # The simulator's timing shows through the router: TPOT >= its per-token time, TTFT >= its prefill,
    # and the router adds little per token: under twice what the worker alone gives on this machine now.
    assert reference >= SIM_TPOT_MS and SIM_TPOT_MS <= bs1["tpot_ms"]["p50"] < 2 * reference, reference
    assert bs1["ttft_ms"]["p50"] >= SIM_TTFT_MS
    # The simulator does not slow down with batch size, so C=8 is several times bs=1 on aggregate.
    assert c8["output_tok_s"] > 3 * bs1["output_tok_s"]
