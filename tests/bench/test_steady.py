"""Steady-state waves, the stop rule and the spread, driven by made-up timestamps (no server)."""

from __future__ import annotations

import pytest

from pd_appliance.bench.metrics import RequestRecord
from pd_appliance.bench.steady import (
    Wave,
    launch_more,
    relative_spread,
    split_waves,
    spread,
    warmup_done,
)
from pd_appliance.bench.workload import (
    Workload,
    WorkloadError,
    corpus_text,
    load_corpus,
    synthetic_prompt,
)


def done_at(end: float, tokens: int = 100, error: str = "") -> RequestRecord:
    return RequestRecord(start=end - 1.0, end=end, output_tokens=tokens, error=error)


def test_waves_are_cut_every_concurrency_completions_from_the_warmup_end() -> None:
    # C=2, warm-up ended at t=10: completions at 11, 12 | 14, 14.5 | 15 (a partial wave: dropped).
    records = [done_at(11), done_at(12), done_at(14), done_at(14.5), done_at(15)]
    waves = split_waves(records, start=10.0, concurrency=2)
    assert waves == [Wave(10.0, 12.0, 2, 200), Wave(12.0, 14.5, 2, 200)]
    assert [w.output_tok_s for w in waves] == [100.0, 80.0]


def test_a_failed_request_fills_its_slot_but_adds_no_tokens() -> None:
    waves = split_waves([done_at(1), done_at(2, error="HTTP 500")], start=0.0, concurrency=2)
    assert waves == [Wave(0.0, 2.0, 2, 100, errors=1)]
    assert waves[0].output_tok_s == 50.0


def test_a_wave_with_a_failure_is_left_out_of_the_spread_not_out_of_the_count() -> None:
    # A timeout slows its wave to 10 tok/s; as noise it would widen the regression tolerance to 90 %.
    waves = [Wave(0, 1, 1, 100), Wave(1, 2, 1, 100), Wave(2, 12, 1, 100, errors=1), Wave(12, 13, 1, 100)]
    result = spread(waves)
    assert (result["waves"], result["failed_waves"]) == (4, 1)
    assert result["p10"] == result["p50"] == 100.0 and relative_spread(result) == 0.0


def wave_list(seconds: list[float], concurrency: int = 1) -> list[Wave]:
    out: list[Wave] = []
    t = 0.0
    for s in seconds:
        out.append(Wave(t, t + s, concurrency, 100))
        t += s
    return out


@pytest.mark.parametrize(
    ("launched", "elapsed", "min_requests", "min_s", "min_waves", "more"),
    [
        (32, 9.0, 32, 0, 2, False),  # today's callers (C=16, 32 requests): the count alone decides
        (31, 9.0, 32, 0, 2, True),
        (16, 9.0, 32, 0, 2, True),  # the request count stays a lower bound
        (32, 9.0, 32, 0, 3, True),  # too few waves
        (48, 9.0, 32, 0, 3, False),
        (48, 59.9, 32, 60, 3, True),  # too short: another wave
        (64, 60.0, 32, 60, 3, False),
        (40, 70.0, 33, 60, 2, True),  # past every minimum, but a wave is finished, never cut
        (48, 70.0, 33, 60, 2, False),
    ],
)
def test_requests_are_sent_in_whole_waves_until_every_lower_bound_is_met(
    launched: int, elapsed: float, min_requests: int, min_s: float, min_waves: int, more: bool
) -> None:
    assert launch_more(launched, 0, elapsed, 16, min_requests, min_s, min_waves) is more


def test_a_failing_level_stops_once_its_failures_reach_the_request_count() -> None:
    assert not launch_more(4, 4, 0.5, 1, 4, 60.0, 5)
    assert launch_more(4, 3, 0.5, 1, 4, 60.0, 5)
    assert launch_more(3, 3, 0.5, 2, 3, 60.0, 5)  # finishes its wave first


def test_warmup_is_the_request_count_without_metrics_and_waits_for_a_full_batch_with_them() -> None:
    assert not warmup_done(15, 16, None, 16, sampled=False)
    assert warmup_done(16, 16, None, 16, sampled=False)
    # With decode /metrics: the count is not enough until the running batch reached C=16 ...
    assert not warmup_done(16, 16, 12.0, 16, sampled=True)
    assert warmup_done(17, 16, 16.0, 16, sampled=True)
    # ... but a decode capped at 12 ends the warm-up one wave later (its gate fails, saying why).
    assert not warmup_done(31, 16, 12.0, 16, sampled=True)
    assert warmup_done(32, 16, 12.0, 16, sampled=True)


def test_spread_percentiles_and_cv_of_the_wave_figures() -> None:
    # Waves of 100 tokens taking 1, 1, 1, 2 s: 100, 100, 100, 50 tok/s.
    result = spread(wave_list([1, 1, 1, 2]))
    assert result["waves"] == 4 and result["measured_s"] == 5
    assert result["p50"] == 100.0 and result["p90"] == 100.0
    assert result["p10"] == pytest.approx(65.0)  # numpy's linear interpolation
    assert result["mean"] == 87.5
    assert result["cv"] == pytest.approx(25.0 / 87.5)
    assert relative_spread(result) == pytest.approx(0.35)


def test_one_wave_has_no_cv_and_no_waves_no_spread() -> None:
    assert spread(wave_list([2]))["cv"] is None
    assert relative_spread(spread([])) is None
    assert relative_spread(None) is None


def test_corpus_is_the_checked_in_64_passages() -> None:
    corpus = load_corpus()
    assert len(corpus) == 64 and len(set(corpus)) == 64
    assert all(not p.startswith("#") for p in corpus)


def test_prompts_are_repeatable_and_differ_from_their_start() -> None:
    assert synthetic_prompt(7, 500, None) == synthetic_prompt(7, 500, None)
    # Of 2,000 consecutive requests (a long C=16 level) no two share their first 64 characters, and
    # only where the corpus repeats a phrase ("Explain the difference between") do two share 24.
    assert len({synthetic_prompt(i, 64, None) for i in range(2000)}) == 2000
    assert len({synthetic_prompt(i, 24, None) for i in range(2000)}) >= 1995
    assert synthetic_prompt(3, 20_000, None) in corpus_text(3, 20_016)
    assert len(synthetic_prompt(3, 20_000, None)) == 20_000


def test_steady_settings_are_checked() -> None:
    with pytest.raises(WorkloadError, match="min_waves must be >= 1"):
        Workload(1, 1, 8, 8, 0, min_waves=0)
    with pytest.raises(WorkloadError, match="min_measure_s must be >= 0"):
        Workload(1, 1, 8, 8, 0, min_measure_s=-1)
