"""Per-request records and the figures computed from them (sglang.bench_serving definitions)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """What one streamed request did, in raw timestamps (time.perf_counter seconds).

    `chunk_times` holds the arrival time of every chunk that carried content; the first one is
    the first token. `output_tokens` comes from the server's usage report when it sends one
    (`token_count_source == "usage"`), else it is the number of content chunks, which
    undercounts when a chunk carries several tokens (speculative decoding) and so can only make
    a gate stricter, never laxer.
    """

    start: float
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    token_count_source: str = "chunks"
    text: str = ""
    error: str = ""

    @property
    def success(self) -> bool:
        return not self.error

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (output_tokens - 1): time per output token after the first."""
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.latency - ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile, numpy's default method, without needing numpy."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _summary_ms(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    out["mean"] = sum(values) / len(values) * 1000.0 if values else None
    for q in PERCENTILES:
        value = percentile(values, q)
        out[f"p{q}"] = None if value is None else value * 1000.0
    return out


@dataclass
class PhaseMetrics:
    """The figures of one measured phase (one concurrency level)."""

    concurrency: int
    requests: int
    completed: int
    errors: int
    error_samples: list[str]
    wall_s: float
    output_tokens: int
    output_tok_s: float
    request_tok_s: dict[str, float | None]
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    token_count_source: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compute_phase(records: Sequence[RequestRecord], concurrency: int, wall_s: float) -> PhaseMetrics:
    """Aggregate `records` of a phase that took `wall_s` seconds.

    Failed requests count in `requests` and `errors` but contribute no tokens, so they lower the
    throughput exactly as in bench_serving (which divides the successful tokens by the wall time).
    """
    ok = [r for r in records if r.success]
    output_tokens = sum(r.output_tokens for r in ok)
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    ttfts = [t for t in (r.ttft for r in ok) if t is not None]
    itls = [gap for r in ok for gap in r.itls]
    decode_rates = [1.0 / t for t in tpots if t > 0]
    request_tok_s: dict[str, float | None] = {
        "mean": sum(decode_rates) / len(decode_rates) if decode_rates else None,
        # The slow tail of per-request decode speed: p10 of the rate is what 90% of users get.
        "p50": percentile(decode_rates, 50),
        "p10": percentile(decode_rates, 10),
    }
    sources = sorted({r.token_count_source for r in ok}) or ["none"]
    errors = [r.error for r in records if not r.success]
    return PhaseMetrics(
        concurrency=concurrency,
        requests=len(records),
        completed=len(ok),
        errors=len(errors),
        error_samples=sorted(set(errors))[:5],
        wall_s=wall_s,
        output_tokens=output_tokens,
        output_tok_s=output_tokens / wall_s if wall_s > 0 else 0.0,
        request_tok_s=request_tok_s,
        ttft_ms=_summary_ms(ttfts),
        tpot_ms=_summary_ms(tpots),
        itl_ms=_summary_ms(itls),
        e2e_ms=_summary_ms([r.latency for r in ok]),
        token_count_source="+".join(sources),
    )
