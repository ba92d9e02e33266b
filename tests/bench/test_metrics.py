"""The figures follow sglang.bench_serving's definitions; percentiles match numpy's."""

from __future__ import annotations

import numpy as np
import pytest

from pd_appliance.bench.metrics import RequestRecord, compute_phase, percentile


@pytest.mark.parametrize(
    "values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], list(np.linspace(0, 1, 37))]
)
@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None


def _record(start: float, first: float, gap: float, tokens: int, error: str = "") -> RequestRecord:
    times = [first + i * gap for i in range(tokens)]
    return RequestRecord(
        start=start,
        end=times[-1] if times else start,
        chunk_times=times,
        output_tokens=tokens,
        token_count_source="usage",
        error=error,
    )


def test_tpot_excludes_first_token_and_throughput_uses_wall_time() -> None:
    # TTFT 0.5 s, then 9 more tokens 0.1 s apart: latency 1.4 s, TPOT (1.4 - 0.5) / 9 = 0.1 s.
    a = _record(0.0, 0.5, 0.1, 10)
    b = _record(0.0, 0.3, 0.2, 10)
    phase = compute_phase([a, b], concurrency=2, wall_s=2.5)
    assert a.tpot == pytest.approx(0.1)
    assert phase.output_tokens == 20
    assert phase.output_tok_s == pytest.approx(20 / 2.5)
    assert phase.ttft_ms["p50"] == pytest.approx(400.0)
    assert phase.tpot_ms["p50"] == pytest.approx(150.0)
    assert phase.request_tok_s["p50"] == pytest.approx((10.0 + 5.0) / 2)
    assert phase.itl_ms["p99"] == pytest.approx(200.0)
    assert phase.errors == 0


def test_failed_requests_count_but_add_no_tokens() -> None:
    ok = _record(0.0, 0.1, 0.1, 10)
    failed = RequestRecord(start=0.0, end=1.0, error="timeout: no complete answer within 1 s")
    phase = compute_phase([ok, failed, failed], concurrency=3, wall_s=1.0)
    assert (phase.requests, phase.completed, phase.errors) == (3, 1, 2)
    assert phase.output_tok_s == pytest.approx(10.0)
    assert phase.error_samples == ["timeout: no complete answer within 1 s"]


def test_all_failed_phase_has_zero_throughput_and_no_latency() -> None:
    phase = compute_phase([RequestRecord(start=0.0, end=1.0, error="HTTP 500: x")], 1, 1.0)
    assert phase.output_tok_s == 0.0
    assert phase.ttft_ms["p50"] is None
    assert phase.token_count_source == "none"
