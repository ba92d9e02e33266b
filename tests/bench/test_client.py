"""The streaming client against the OpenAI test double: figures, probe, and every failure mode."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from openai_stream_double import DoubleConfig, OpenAIStreamDouble

from pd_appliance.bench.client import Endpoint, probe, run_phase, wait_ready
from pd_appliance.bench.metrics import PhaseMetrics, RequestRecord
from pd_appliance.bench.runner import Plan, ProbeSpec, measure, plan_from_lists
from pd_appliance.bench.workload import Workload, WorkloadError, synthetic_prompt


def with_double(config: DoubleConfig, body: Callable[[OpenAIStreamDouble, str], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        double = OpenAIStreamDouble(config)
        url = await double.start()
        try:
            return await body(double, url)
        finally:
            await double.stop()

    return asyncio.run(main())


async def phase(
    url: str, api: str = "completions", n: int = 4, c: int = 2, out: int = 8, timeout: float = 10.0
) -> tuple[PhaseMetrics, list[RequestRecord]]:
    workload = Workload(c, n, 32, out, warmup_requests=1, api=api, request_timeout_s=timeout)
    measured = await run_phase(
        Endpoint(url, "double-model"), workload, lambda i: synthetic_prompt(i, 32, None)
    )
    return measured.metrics, measured.records


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_phase_figures_and_request_shape(api: str) -> None:
    cfg = DoubleConfig(ttft_s=0.05, tpot_s=0.01)

    async def body(double: OpenAIStreamDouble, url: str):
        metrics, records = await phase(url, api, n=4, c=2, out=8)
        return double, metrics, records

    double, metrics, records = with_double(cfg, body)
    assert (metrics.requests, metrics.errors, metrics.output_tokens) == (4, 0, 32)
    assert metrics.token_count_source == "usage"
    # Server timing: 50 ms to the first token, 10 ms per token after it.
    assert metrics.ttft_ms["p50"] == pytest.approx(50, abs=25)
    assert metrics.tpot_ms["p50"] == pytest.approx(10, abs=4)
    # Warm-up is sent but not counted: 5 requests reached the server, 4 were measured.
    assert len(double.bodies) == 5 and len(records) == 4
    sent = double.bodies[-1]
    assert sent["ignore_eos"] is True and sent["stream"] is True and sent["max_tokens"] == 8
    assert sent["temperature"] == 0.0 and sent["stream_options"] == {"include_usage": True}
    assert ("messages" in sent) == (api == "chat")
    # The chat template's thinking mode is set, off, on the chat API (both templates' names for it).
    expected = {"thinking": False, "enable_thinking": False} if api == "chat" else None
    assert sent.get("chat_template_kwargs") == expected


def test_concurrency_is_closed_loop() -> None:
    # 8 requests of ~0.2 s at C=4 take two rounds (~0.4 s), not one and not eight.
    cfg = DoubleConfig(ttft_s=0.0, tpot_s=0.02)

    async def body(double: OpenAIStreamDouble, url: str):
        metrics, _ = await phase(url, n=8, c=4, out=10)
        return metrics

    metrics = with_double(cfg, body)
    assert 0.3 < metrics.wall_s < 0.7


def test_multi_token_chunks_are_counted_from_usage() -> None:
    cfg = DoubleConfig(tokens_per_chunk=4, tpot_s=0.005)
    metrics, records = with_double(cfg, lambda d, url: phase(url, n=2, c=1, out=8))
    assert metrics.output_tokens == 16 and metrics.errors == 0
    assert len(records[0].chunk_times) == 2  # two chunks of four tokens


def test_without_usage_tokens_are_counted_as_chunks() -> None:
    cfg = DoubleConfig(tokens_per_chunk=2, send_usage=False)
    metrics, _ = with_double(cfg, lambda d, url: phase(url, n=2, c=1, out=8))
    assert metrics.token_count_source == "chunks"
    assert metrics.output_tokens == 8  # 4 chunks each: an undercount, never an overcount


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("fail_requests", "HTTP 500"),
        ("hang_requests", "timeout"),
        ("short_requests", "expected 8 output tokens, got 7"),
        ("drop_done_requests", "ended before 'data: [DONE]'"),
    ],
)
def test_faults_become_errors(fault: str, message: str) -> None:
    # Request 1 is the warm-up; request 3 is the second measured one.
    cfg = DoubleConfig(**{fault: {3}})
    metrics, records = with_double(cfg, lambda d, url: phase(url, n=3, c=1, out=8, timeout=0.5))
    assert metrics.errors == 1 and metrics.completed == 2
    assert message in records[1].error
    assert metrics.output_tokens == 16


def test_connection_refused_is_an_error_not_a_crash() -> None:
    async def body() -> Any:
        return await phase("http://127.0.0.1:9", n=2, c=2)

    metrics, records = asyncio.run(body())
    assert metrics.errors == 2 and metrics.output_tok_s == 0.0
    assert all("Connect" in r.error or "Errno" in r.error for r in records)


def test_probe_passes_on_paris_and_fails_on_garbage() -> None:
    good = with_double(
        DoubleConfig(), lambda d, url: probe(Endpoint(url, "m"), "The capital of France is", "Paris")
    )
    bad = with_double(
        DoubleConfig(probe_answer="Lyon Lyon Lyon"),
        lambda d, url: probe(Endpoint(url, "m"), "The capital of France is", "Paris"),
    )
    assert good["passed"] and "Paris" in good["answer"]
    assert not bad["passed"] and bad["answer"].strip().startswith("Lyon")


def test_failed_probe_skips_the_timing() -> None:
    async def body(double: OpenAIStreamDouble, url: str):
        plan = plan_from_lists(url, [1, 4], [2], 16, 8, [0], model="double-model")
        return double, await measure(plan)

    double, result = with_double(DoubleConfig(probe_answer="Berlin"), body)
    assert result["probe"]["passed"] is False
    assert result["phases"] == []
    assert double.requests == 1


def test_measure_discovers_model_and_runs_each_level() -> None:
    async def body(double: OpenAIStreamDouble, url: str):
        plan = plan_from_lists(
            url, [1, 4], [2, 8], 16, 6, None, ready_timeout_s=5, ready_poll_interval_s=0.05
        )
        return double, await measure(plan, keep_records=True)

    double, result = with_double(DoubleConfig(not_ready_polls=1), body)
    assert result["model"] == "double-model"
    assert result["ready"]["ready"] is True and double.readiness_polls == 2
    assert [p["concurrency"] for p in result["phases"]] == [1, 4]
    assert [p["requests"] for p in result["phases"]] == [2, 8]
    # warm-up defaults to one request per slot: 1 probe + (1 + 2) + (4 + 8)
    assert double.requests == 16
    assert [p["warmup_completed"] for p in result["phases"]] == [1, 4]
    assert [p["sent"] for p in result["phases"]] == [3, 12]
    assert [p["spread"]["waves"] for p in result["phases"]] == [2, 2]
    assert len(result["records"]["4"]) == 8
    # Every prompt differs from its first word on, so no prefix cache can serve it.
    prompts = [b.get("prompt") for b in double.bodies[1:]]
    assert len(set(prompts)) == len(prompts)


def test_wait_ready_gives_up_with_last_status() -> None:
    result = with_double(
        DoubleConfig(not_ready_polls=100), lambda d, url: wait_ready(Endpoint(url, "m"), 0.3, interval_s=0.1)
    )
    assert result["ready"] is False and "503" in result["last"]


def test_bad_plans_name_the_setting() -> None:
    with pytest.raises(WorkloadError, match="num_requests has 3 entries for 2"):
        plan_from_lists("http://x", [1, 16], [1, 2, 3], 8, 8)
    with pytest.raises(WorkloadError, match="output_len must be >= 2"):
        Workload(1, 1, 8, 1, 0)
    with pytest.raises(WorkloadError, match="concurrency levels repeat"):
        plan_from_lists("http://x", [1, 1], [1], 8, 8)
    with pytest.raises(WorkloadError, match="api must be one of"):
        Workload(1, 1, 8, 8, 0, api="generate")


def test_synthetic_prompt_exact_characters() -> None:
    assert len(synthetic_prompt(3, 257, None)) == 257
    assert synthetic_prompt(3, 64, None) != synthetic_prompt(4, 64, None)
    assert synthetic_prompt(3, 64, None) == synthetic_prompt(3, 64, None)


def test_plan_defaults() -> None:
    plan = Plan("http://x", [Workload(1, 1, 8, 8, 0)])
    assert plan.probe == ProbeSpec() and plan.probe.expect == "Paris"


def test_a_level_runs_in_whole_waves_until_its_minimum_time_and_counts_a_stalled_request() -> None:
    # C=2, at least 2 requests but 0.4 s of waves: requests of ~0.1 s make several waves. Request 6
    # (a measured one) stalls past the 0.3 s timeout; the loop drains, so it counts as failed.
    workload = Workload(2, 2, 32, 5, warmup_requests=2, request_timeout_s=0.3, min_measure_s=0.4)

    async def body(double: OpenAIStreamDouble, url: str):
        return await run_phase(Endpoint(url, "m"), workload, lambda i: synthetic_prompt(i, 32, None))

    measured = with_double(DoubleConfig(tpot_s=0.02, hang_requests={6}), body)
    metrics = measured.metrics
    assert measured.warmup_completed == 2
    assert len(measured.waves) >= 3 and len(measured.records) == 2 * len(measured.waves)
    assert measured.waves[-1].end - measured.waves[0].start >= 0.4
    assert metrics.errors == 1 and "timeout" in metrics.error_samples[0]
    assert metrics.wall_s == pytest.approx(sum(w.wall_s for w in measured.waves))
