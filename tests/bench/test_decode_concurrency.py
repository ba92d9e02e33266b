"""The decode-concurrency check: SGLang's running-requests gauge, sampled while a level is measured,
must reach the concurrency asked for; a capped decode fails the gate and loses the tuner's vote."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai_stream_double import DoubleConfig, OpenAIStreamDouble
from test_report import variant

from pd_appliance.bench import cli
from pd_appliance.bench.decode_metrics import MetricsParseError, running_requests
from pd_appliance.bench.gates import decode_concurrency_gates
from pd_appliance.bench.report import build_report, select_fastest
from pd_appliance.bench.runner import measure, plan_from_lists

# Shaped like SGLang 0.5.23's scheduler collector: the stats-logging rank's series, a second TP
# rank (--enable-metrics-for-all-schedulers), two DP ranks, and a per-priority breakdown.
_LABELS = 'engine_type="decode",model_name="dsv4-flash",pp_rank="0"'
SGLANG_EXPOSITION = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{_LABELS},tp_rank="0",dp_rank="0",priority=""}} 5.0
sglang:num_running_reqs{{{_LABELS},tp_rank="0",dp_rank="1",priority=""}} 6.0
sglang:num_running_reqs{{{_LABELS},tp_rank="0",dp_rank="0",priority="1"}} 5.0
sglang:num_running_reqs{{{_LABELS},tp_rank="1",dp_rank="0",priority=""}} 5.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{_LABELS},tp_rank="0"}} 5.0
"""


def test_running_requests_sums_rank_0_totals_only() -> None:
    assert running_requests(SGLANG_EXPOSITION) == 11.0
    with pytest.raises(MetricsParseError, match="--enable-metrics"):
        running_requests("# TYPE other gauge\nother 1\n")


def measure_double(max_running: int) -> dict[str, Any]:
    """pd-bench against the double (16 tokens at 20 ms: each request outlasts the 0.1 s sampling)."""

    async def main() -> dict[str, Any]:
        double = OpenAIStreamDouble(DoubleConfig(tpot_s=0.02, max_running=max_running))
        url = await double.start()
        try:
            plan = plan_from_lists(
                url, [1, 16], [2, 32], 32, 16, [1, 16], model="double-model",
                decode_metrics_urls=[f"{url}/metrics"], metrics_interval_s=0.1,
            )  # fmt: skip
            return await measure(plan)
        finally:
            await double.stop()

    return asyncio.run(main())


def test_a_capped_decode_fails_the_gate_naming_the_cap() -> None:
    free, capped = measure_double(0), measure_double(6)
    assert [p["decode_running"]["peak"] for p in free["phases"]] == [1.0, 16.0]
    assert capped["phases"][1]["decode_running"]["peak"] == 6.0
    gate = decode_concurrency_gates(capped, [16])[0]
    assert not gate.passed and gate.measured == 6.0 and gate.limit == 16.0
    assert "decode ran at most 6 requests at once" in gate.message and "< 16 asked" in gate.message
    assert "serving_max_running_requests" in gate.message
    assert decode_concurrency_gates(free, [16])[0].passed


def with_running(m: dict[str, Any], peak: float | None, errors: list[str] | None = None) -> dict[str, Any]:
    for p in m["phases"]:
        seen = None if peak is None else min(peak, p["concurrency"])
        p["decode_running"] = {
            "metric": "sglang:num_running_reqs", "urls": ["http://d:1/metrics"], "asked": p["concurrency"],
            "peak": seen, "samples": 0 if peak is None else 9, "errors": errors or [],
        }  # fmt: skip
    return m


def test_unreadable_or_unsampled_metrics_fail_the_gate_saying_so() -> None:
    unread = decode_concurrency_gates(
        with_running(variant("d", 50, 200), None, ["http://d:1/metrics: HTTP 404"]), [16]
    )[0]
    assert not unread.passed and "could not read sglang:num_running_reqs" in unread.message
    assert "HTTP 404" in unread.message
    unsampled = decode_concurrency_gates(variant("d", 50, 200), [16])[0]
    assert not unsampled.passed and "validation_decode_metrics_urls" in unsampled.message


def test_the_objective_skips_a_fast_variant_that_never_reached_c16() -> None:
    runs = [
        with_running(variant("deployed", 50, 200), 16),
        with_running(variant("faster", 60, 300), 16),
        with_running(variant("capped-fastest", 70, 900), 6),
        with_running(variant("slow-bs1", 20, 400), 16),
    ]
    selection = select_fastest(runs, 16, {1: 40.0, 16: 130.0}, concurrency_levels=[16])
    assert selection["fastest"] == "faster"
    objective = "highest C=16 output tok/s subject to bs=1 >= 40 tok/s, C=16 >= 130 tok/s"
    assert selection["objective"] == objective
    reasons = {r["variant"]: r["reasons"] for r in selection["ranking"]}
    assert any("decode ran at most 6" in r for r in reasons["capped-fastest"])
    assert reasons["slow-bs1"] == ["bs=1 output throughput 20.00 tok/s < threshold 40.00 tok/s"]
    report = build_report(
        runs, "faster", {1: 40.0, 16: 130.0}, selection=selection, decode_concurrency_levels=[16]
    )
    assert report["passed"]
    assert report["variants_passing_floors"]["capped-fastest"] is False


def test_pd_bench_cli_samples_decode_and_its_report_gates_and_shows_the_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    double = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "openai_stream_double.py"), "--port", "0",
         "--tpot-ms", "20", "--max-running", "6"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert double.stdout is not None
        url = f"http://127.0.0.1:{int(double.stdout.readline())}"
        run = ["run", "--url", url, "--concurrency", "1", "16", "--num-requests", "2", "32",
               "--input-len", "32", "--output-len", "16", "--decode-metrics-url", f"{url}/metrics",
               "--metrics-interval", "0.1", "--out", str(tmp_path / "run.json")]  # fmt: skip
        assert cli.main(run) == 0
        assert "decode running requests: peak 6.0 of 16 asked" in capsys.readouterr().out
        report = ["report", str(tmp_path / "run.json"), "--threshold", "1=1", "--threshold", "16=1",
                  "--target", "16=1000", "--check-decode-concurrency",
                  "--out-dir", str(tmp_path / "r")]  # fmt: skip
        assert cli.main(report) == 1
        out = capsys.readouterr().out
        assert "FAIL: C=16: decode ran at most 6 requests at once" in out
        assert "not gated: C=16:" in out and "of the target 1000 tok/s" in out
    finally:
        double.terminate()
        double.wait(timeout=10)
