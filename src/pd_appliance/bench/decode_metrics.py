"""How many requests the decode workers ran at once while a phase was measured.

A closed loop at C=16 only measures C=16 when the decode workers admit 16 requests: a KV pool too
small for 16 sequences (or --max-running-requests) caps the running batch, and the rest wait in
the queue. The throughput then flattens at a lower batch and the figure is quoted for a
concurrency that never ran (sglang PR 33075: decode stuck at 6 running requests from batch 8 on).
So the client samples SGLang's running-requests gauge on every decode worker while it measures.

The gauge, read in the pinned wheel (sglang 0.5.23, srt/observability/metrics_collector.py):
`sglang:num_running_reqs`, labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (+ dp_rank
with DP attention, + priority="" when priority scheduling is on, whose per-priority breakdowns
carry priority="<int>"). Only the stats-logging rank (attention TP rank 0) sets it unless
--enable-metrics-for-all-schedulers; the decode scheduler refreshes it every decode_log_interval
(40) steps (srt/managers/scheduler_components/metrics_reporter.py). One worker's running requests
are therefore the sum over its series with tp_rank "0" and no per-priority label.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

RUNNING_METRIC = "sglang:num_running_reqs"


class MetricsParseError(ValueError):
    """A /metrics body without the running-requests gauge; the message says what was there."""


def running_requests(exposition: str) -> float:
    """Running requests of one worker from its Prometheus text exposition."""
    total: float | None = None
    for family in text_string_to_metric_families(exposition):
        if family.name != RUNNING_METRIC:
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("tp_rank", "0") != "0" or labels.get("priority", ""):
                continue
            total = (total or 0.0) + float(sample.value)
    if total is None:
        raise MetricsParseError(
            f"no {RUNNING_METRIC} sample: is this an SGLang worker started with --enable-metrics "
            "(serving_enable_metrics)?"
        )
    return total


@dataclass
class RunningSampler:
    """Polls every decode worker's /metrics every `interval_s` until stopped.

    A sample is the sum over all workers read in one round; a round where any worker failed is
    not a sample (a partial sum would understate the peak), its error is kept instead.
    """

    urls: Sequence[str]
    interval_s: float = 1.0
    timeout_s: float = 5.0
    totals: list[float] = field(default_factory=list)
    per_url_peak: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    rounds: int = 0

    async def _read(self, session: aiohttp.ClientSession, url: str) -> float:
        async with session.get(url) as response:
            if response.status != 200:
                raise MetricsParseError(f"HTTP {response.status}")
            return running_requests(await response.text())

    async def _round(self, session: aiohttp.ClientSession) -> None:
        self.rounds += 1
        results = await asyncio.gather(*(self._read(session, u) for u in self.urls), return_exceptions=True)
        failed = [(u, r) for u, r in zip(self.urls, results, strict=True) if isinstance(r, BaseException)]
        for url, exc in failed:
            if len(self.errors) < 5:
                self.errors.append(f"{url}: {type(exc).__name__}: {exc}")
        if failed:
            return
        values = [float(r) for r in results if not isinstance(r, BaseException)]
        for url, value in zip(self.urls, values, strict=True):
            self.per_url_peak[url] = max(self.per_url_peak.get(url, 0.0), value)
        self.totals.append(sum(values))

    async def run(self, stop: asyncio.Event) -> None:
        """Sample now, then every `interval_s`, and once more when `stop` is set."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                started = time.monotonic()
                await self._round(session)
                if stop.is_set():
                    return
                remaining = self.interval_s - (time.monotonic() - started)
                try:
                    await asyncio.wait_for(stop.wait(), max(remaining, 0.0))
                except asyncio.TimeoutError:
                    continue
                await self._round(session)
                return

    def reset(self) -> None:
        """Forget what was read so far (the warm-up's samples): the summary covers what follows."""
        self.totals.clear()
        self.per_url_peak.clear()
        self.errors.clear()
        self.rounds = 0

    def summary(self, asked: int) -> dict[str, Any]:
        """What the report and the gate read: the peak against the concurrency asked for."""
        peak = max(self.totals) if self.totals else None
        return {
            "metric": RUNNING_METRIC,
            "urls": list(self.urls),
            "asked": asked,
            "peak": peak,
            "median": statistics.median(self.totals) if self.totals else None,
            "samples": len(self.totals),
            "rounds": self.rounds,
            "per_url_peak": dict(self.per_url_peak),
            "errors": list(self.errors),
            "reached": peak is not None and peak >= asked,
        }
