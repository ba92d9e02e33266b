"""Gates pass and fail at their thresholds; errors, a failed probe and regressions fail too."""

from __future__ import annotations

from typing import Any

import pytest

from pd_appliance.bench.gates import (
    all_passed,
    effective_tolerance,
    failure_message,
    regression_gates,
    throughput_gates,
)

THRESHOLDS = {1: 10.0, 16: 25.0}


def measurement(bs1: float, c16: float, errors16: int = 0, probe: bool = True) -> dict[str, Any]:
    def phase(c: int, tok_s: float, errors: int) -> dict[str, Any]:
        return {
            "concurrency": c,
            "requests": 32,
            "errors": errors,
            "error_samples": ["timeout: no complete answer within 600 s"] if errors else [],
            "output_tok_s": tok_s,
            "request_tok_s": {"p50": tok_s / c},
        }

    return {
        "variant": "deployed",
        "probe": {
            "passed": probe,
            "answer": " Paris" if probe else " garbage",
            "expected": "Paris",
            "error": "",
        },
        "phases": [phase(1, bs1, 0), phase(16, c16, errors16)] if probe else [],
    }


def by_name(gates: list) -> dict[str, Any]:
    return {g.name: g for g in gates}


@pytest.mark.parametrize(
    ("bs1", "c16", "bs1_ok", "c16_ok"),
    [
        (10.01, 25.01, True, True),  # just above both
        (10.0, 25.0, True, True),  # exactly at: the threshold is a floor to reach
        (9.99, 25.01, False, True),  # bs=1 just below
        (10.01, 24.99, True, False),  # C=16 just below
        (9.99, 24.99, False, False),
    ],
)
def test_throughput_floors(bs1: float, c16: float, bs1_ok: bool, c16_ok: bool) -> None:
    gates = by_name(throughput_gates(measurement(bs1, c16), THRESHOLDS))
    assert gates["bs=1 output tok/s"].passed is bs1_ok
    assert gates["C=16 output tok/s"].passed is c16_ok
    assert all_passed(list(gates.values())) is (bs1_ok and c16_ok)


def test_failure_message_shows_measured_and_threshold_for_each() -> None:
    gates = throughput_gates(measurement(9.99, 30.0), THRESHOLDS)
    message = failure_message(gates, "deployed")
    assert "bs=1 output throughput 9.99 tok/s < threshold 10.00 tok/s" in message
    assert "C=16 output throughput 30.00 tok/s >= threshold 25.00 tok/s" in message
    assert failure_message(throughput_gates(measurement(11, 30), THRESHOLDS), "deployed") == ""


def test_any_failed_request_fails_even_when_fast_enough() -> None:
    gates = by_name(throughput_gates(measurement(50.0, 500.0, errors16=1), THRESHOLDS))
    assert gates["C=16 failed requests"].passed is False
    assert "1 of 32 requests failed (timeout" in gates["C=16 failed requests"].message
    assert gates["C=16 output tok/s"].passed is True
    assert by_name(throughput_gates(measurement(50, 500, errors16=1), THRESHOLDS, 0.05))[
        "C=16 failed requests"
    ].passed


def test_failed_probe_fails_every_gate() -> None:
    gates = throughput_gates(measurement(0, 0, probe=False), THRESHOLDS)
    named = by_name(gates)
    assert named["correctness probe"].passed is False
    assert "lacks 'Paris'" in named["correctness probe"].message
    assert named["bs=1 output tok/s"].passed is False
    assert "not measured (the probe failed)" in named["bs=1 output tok/s"].message


def test_threshold_for_an_unmeasured_level_fails() -> None:
    gates = by_name(throughput_gates(measurement(20, 50), {1: 10.0, 32: 40.0}))
    assert gates["C=32 output tok/s"].passed is False
    assert "not in the concurrency list" in gates["C=32 output tok/s"].message


LAST = {
    "accepted_at": "2026-12-01T00:00:00Z",
    "figures": {"bs=1 output tok/s": 20.0, "C=16 output tok/s": 100.0},
}


@pytest.mark.parametrize(("c16", "ok"), [(90.01, True), (90.0, True), (89.99, False)])
def test_regression_at_tolerance(c16: float, ok: bool) -> None:
    gates = by_name(regression_gates(measurement(20.0, c16), LAST, 0.10))
    assert gates["regression: C=16 output tok/s"].passed is ok
    assert gates["regression: bs=1 output tok/s"].passed is True
    if not ok:
        assert "last accepted 100.00" in gates["regression: C=16 output tok/s"].message


def test_regression_off_without_tolerance_or_history() -> None:
    assert regression_gates(measurement(1, 1), LAST, None) == []
    assert regression_gates(measurement(1, 1), None, 0.1) == []


def with_spread(
    m: dict[str, Any], concurrency: int, p10: float, p50: float, waves: int = 6
) -> dict[str, Any]:
    for phase in m["phases"]:
        if phase["concurrency"] == concurrency:
            phase["spread"] = {"p10": p10, "p50": p50, "p90": p50, "cv": 0.02, "waves": waves}
    return m


def test_a_spread_wider_than_the_tolerance_widens_that_levels_gate() -> None:
    # C=16's waves: p10 80 and p50 100, so one wave in ten is 20 % below the median; the configured
    # 10 % would fail this run at 85 on noise alone. bs=1 spreads 2 %: its 10 % stays.
    m = with_spread(with_spread(measurement(17.9, 85.0), 16, 80.0, 100.0), 1, 19.6, 20.0)
    gates = by_name(regression_gates(m, LAST, 0.10))
    c16 = gates["regression: C=16 output tok/s"]
    assert c16.passed and c16.limit == pytest.approx(80.0)
    assert (
        "tolerance 20.0%: the waves' (p50-p10)/p50 of 6 waves, wider than the configured 10.0%" in c16.message
    )
    bs1 = gates["regression: bs=1 output tok/s"]
    assert not bs1.passed and bs1.limit == pytest.approx(18.0)
    assert "tolerance 10.0%: the configured one (the waves' (p50-p10)/p50 of 6 waves is 2.0%)" in bs1.message


def test_the_spread_never_tightens_the_configured_tolerance() -> None:
    m = with_spread(measurement(20.0, 89.0), 16, 99.0, 100.0)
    assert not by_name(regression_gates(m, LAST, 0.10))["regression: C=16 output tok/s"].passed
    assert effective_tolerance(0.10, m["phases"][1]).applied == 0.10


def test_without_waves_the_configured_tolerance_applies_and_says_so() -> None:
    tolerance = effective_tolerance(0.15, {"concurrency": 16})
    assert (tolerance.applied, tolerance.spread, tolerance.source) == (0.15, None, "configured")
    assert tolerance.text() == "tolerance 15.0%: the configured one (no wave spread measured)"
