"""Steady-state measurement: when warm-up ends, how completions form waves, when to stop, the spread.

A level is one continuous closed loop (`concurrency` requests in flight, a new one sent as each
completes). Its first requests are warm-up: the running batch fills, caches and CUDA graphs warm.
After that the completions are cut into *waves* of `concurrency` completed requests; a wave's
output tok/s is the output tokens of its requests over its wall time (from the previous wave's
last completion to its own). The loop sends requests in whole waves until it has at least
`min_waves` waves, `min_measure_s` seconds of measured time and `min_requests` measured requests,
then lets the last ones finish, so one figure comes with the spread of the waves it is made of.

Everything here is pure (records and clocks in, decisions and figures out), so the unit tests
drive it with made-up timestamps instead of a server.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pd_appliance.bench.metrics import RequestRecord, percentile


@dataclass(frozen=True)
class Wave:
    """`requests` completions from `start` (the previous wave's end) to `end`."""

    start: float
    end: float
    requests: int
    output_tokens: int
    errors: int = 0

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def warmup_done(
    completed: int,
    min_requests: int,
    running_peak: float | None,
    concurrency: int,
    sampled: bool,
) -> bool:
    """Whether the warm-up may end after `completed` warm-up completions.

    Without decode /metrics (`sampled` false) the warm-up is the fixed `min_requests` count, as it
    always was. With them it also waits until the decode workers' running batch reached the
    concurrency (the batch is then full, which is the steady state being measured), but for at
    most one more wave (`min_requests + concurrency`): a decode capped below the concurrency never
    gets there, and its decode-concurrency gate already fails and says why.
    """
    if completed < min_requests:
        return False
    if not sampled:
        return True
    reached = running_peak is not None and running_peak >= concurrency
    return reached or completed >= min_requests + concurrency


def split_waves(records: Sequence[RequestRecord], start: float, concurrency: int) -> list[Wave]:
    """Cut measured completions (in completion order) into full waves of `concurrency` requests.

    `start` is when the warm-up ended (its last completion). A failed request completes a slot of
    the wave like any other but adds no tokens, so failures lower the wave's figure. A trailing
    partial wave is not a wave.
    """
    waves: list[Wave] = []
    begin = start
    for first in range(0, len(records) - concurrency + 1, concurrency):
        chunk = records[first : first + concurrency]
        end = max(r.end for r in chunk)
        tokens = sum(r.output_tokens for r in chunk if r.success)
        errors = sum(1 for r in chunk if not r.success)
        waves.append(Wave(begin, end, len(chunk), tokens, errors))
        begin = end
    return waves


def launch_more(
    launched: int,
    errors: int,
    elapsed_s: float,
    concurrency: int,
    min_requests: int,
    min_measure_s: float,
    min_waves: int,
) -> bool:
    """Whether the closed loop sends another measured request; when it stops, the loop drains.

    `launched` counts the measured requests sent so far (those in flight when the warm-up ended
    included), `errors` the failed ones completed, `elapsed_s` the measured time so far. Requests
    are sent in whole waves until at least `min_requests` (the old fixed count, still a lower
    bound: with `min_measure_s` 0 and few `min_waves` a level sends exactly what it sent before),
    `min_waves` waves and `min_measure_s` seconds. Every sent request is awaited (a drain, as
    before), so a request that stalls is counted as failed, never dropped. A level whose failures
    already reach `min_requests` stops at the wave's end: its error gate fails whatever comes
    next, and a server failing instantly would otherwise be hammered for `min_measure_s` seconds.
    """
    if launched % concurrency:
        return True  # finish the wave
    if errors >= max(min_requests, 1) and launched >= min_requests:
        return False
    return launched < max(min_requests, min_waves * concurrency) or elapsed_s < min_measure_s


def spread(waves: Sequence[Wave]) -> dict[str, Any]:
    """p10/p50/p90 and the coefficient of variation (stdev/mean) of the per-wave output tok/s.

    Over the waves without a failed request: a failure is not noise (the failed-requests gate
    judges it), and a wave slowed by a timeout would widen the spread and with it the regression
    gate's tolerance. `failed_waves` says how many were left out.
    """
    rates = [w.output_tok_s for w in waves if not w.errors]
    mean = statistics.fmean(rates) if rates else None
    cv = statistics.stdev(rates) / mean if len(rates) > 1 and mean else None
    return {
        "waves": len(waves),
        "failed_waves": len(waves) - len(rates),
        "measured_s": sum(w.wall_s for w in waves),
        "p10": percentile(rates, 10),
        "p50": percentile(rates, 50),
        "p90": percentile(rates, 90),
        "mean": mean,
        "cv": cv,
    }


def relative_spread(phase_spread: dict[str, Any] | None) -> float | None:
    """The downside spread of a level's waves as a fraction: (p50 - p10) / p50.

    This, not the CV, is what the regression gate widens its tolerance to: the gate asks how far
    below the baseline a figure may fall by noise alone, and (p50 - p10) / p50 is exactly how far
    below its median one run in ten falls, in the tolerance's own unit (a fraction below). The CV
    mixes in the upside and one outlier wave inflates it. None when there is nothing to go on.
    """
    if not phase_spread:
        return None
    p10, p50 = phase_spread.get("p10"), phase_spread.get("p50")
    if p10 is None or not p50:
        return None
    return max(0.0, (float(p50) - float(p10)) / float(p50))
