"""The rehearsal engine's /metrics: SGLang 0.5.23's metric names, labels and histogram buckets.

Names, label sets and buckets are read in the pinned wheel, sglang-0.5.23 (cp311):
  - sglang/srt/observability/metrics_collector.py, SchedulerMetricsCollector: the gauges
    num_running_reqs and num_queue_reqs; the PD gauges
    num_prefill_inflight_queue_reqs (prefill) and num_decode_transfer_queue_reqs (decode); the
    counters num_transfer_failed_reqs_total and num_bootstrap_failed_reqs_total; the histogram
    kv_transfer_latency_ms (observed by the prefill, disaggregation/prefill.py). Labels model_name,
    engine_type (prefill|decode|unified, DisaggregationMode.to_engine_type), tp_rank, pp_rank,
    moe_ep_rank; only TP rank 0 reports, so tp_rank is "0".
  - the same file, TokenizerMetricsCollector: prompt_tokens_total, generation_tokens_total,
    num_requests_total (+ label is_streaming), time_to_first_token_seconds and
    request_time_per_output_token_seconds and e2e_request_latency_seconds (+ is_streaming),
    inter_token_latency_seconds; labels model_name, engine_type.
  - sglang/srt/managers/tokenizer_manager.py, collect_metrics(): a PD prefill worker observes
    neither TTFT nor ITL nor TPOT, only the finished-request counters and the e2e latency.
SGLang serves these through prometheus_client's multiprocess collector, which writes no
`_created` series; neither does this module. Every series carries simulated="true" (the way
SGLang's --extra-metric-labels adds a label), and pd_sim_worker_info names the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from pd_standins import __version__

disable_created_metrics()

# Buckets of TokenizerMetricsCollector's defaults (metrics_collector.py, SGLang 0.5.23).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
    0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
KV_TRANSFER_LATENCY_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
ENGINE_TYPES = {"prefill": "prefill", "decode": "decode", "null": "unified"}


class EngineMetrics:
    """One worker's SGLang-named metrics, in a registry of its own (several workers per process in tests)."""

    def __init__(
        self,
        role: str,
        model_name: str,
        running: Callable[[], float],
        transfer_queue: Callable[[], float],
        queued: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.role = role
        self.registry = CollectorRegistry(auto_describe=True)
        engine_type = ENGINE_TYPES[role]
        base = {"model_name": model_name, "engine_type": engine_type}
        self.tokenizer_labels = {**base, "simulated": "true"}
        self.scheduler_labels = {
            **base,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
            "simulated": "true",
        }
        sched, tok, reg = list(self.scheduler_labels), list(self.tokenizer_labels), self.registry
        streaming = [*tok, "is_streaming"]

        info = Gauge(
            "pd_sim_worker_info",
            "The answering worker is pd-sim-worker, a simulator.",
            ["role", "version"],
            registry=reg,
        )
        info.labels(role=role, version=__version__).set(1)

        def gauge(name: str, doc: str, value: Callable[[], float] | None = None) -> Gauge:
            metric = Gauge(name, doc, sched, registry=reg, multiprocess_mode="mostrecent")
            child = metric.labels(**self.scheduler_labels)
            if value is not None:
                child.set_function(value)
            return metric

        gauge("sglang:num_running_reqs", "The number of running requests.", running)
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", queued)
        if role == "prefill":
            gauge(
                "sglang:num_prefill_inflight_queue_reqs",
                "The number of requests in the prefill inflight queue.",
                transfer_queue,
            )
        elif role == "decode":
            gauge(
                "sglang:num_decode_transfer_queue_reqs",
                "The number of requests in the decode transfer queue.",
                transfer_queue,
            )
        self.transfer_failed = Counter(
            "sglang:num_transfer_failed_reqs_total",
            "The number of transfer failed requests.",
            sched,
            registry=reg,
        )
        self.bootstrap_failed = Counter(
            "sglang:num_bootstrap_failed_reqs_total",
            "The number of bootstrap failed requests.",
            sched,
            registry=reg,
        )
        self.kv_transfer_latency_ms = Histogram(
            "sglang:kv_transfer_latency_ms",
            "Histogram of KV cache transfer latency in ms.",
            sched,
            registry=reg,
            buckets=KV_TRANSFER_LATENCY_MS_BUCKETS,
        )
        for counter in (self.transfer_failed, self.bootstrap_failed):
            counter.labels(**self.scheduler_labels)
        if role == "prefill":
            self.kv_transfer_latency_ms.labels(**self.scheduler_labels)

        self.prompt_tokens = Counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", streaming, registry=reg
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            streaming,
            registry=reg,
        )
        self.requests = Counter(
            "sglang:num_requests_total", "Number of requests processed.", streaming, registry=reg
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            streaming,
            registry=reg,
            buckets=TTFT_BUCKETS,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok,
            registry=reg,
            buckets=ITL_BUCKETS,
        )
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
            streaming,
            registry=reg,
            buckets=ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            streaming,
            registry=reg,
            buckets=E2E_BUCKETS,
        )
        # Both streaming values exist from the start (non-streaming first): rate() sees the first request.
        for value in ("false", "true"):
            for counter in (self.prompt_tokens, self.generation_tokens, self.requests):
                counter.labels(**self.tokenizer_labels, is_streaming=value)

    def exposition(self) -> bytes:
        """The /metrics body in Prometheus' text format."""
        return generate_latest(self.registry)

    def request(self, stream: bool) -> RequestMetrics:
        return RequestMetrics(self, stream)

    def kv_transfer(self, latency_s: float) -> None:
        """The prefill handed a room's KV over to the decode (the rendezvous answered)."""
        self.kv_transfer_latency_ms.labels(**self.scheduler_labels).observe(latency_s * 1000.0)

    def transfer_failure(self) -> None:
        self.transfer_failed.labels(**self.scheduler_labels).inc()


class RequestMetrics:
    """Observes one request as SGLang's tokenizer manager does (collect_metrics)."""

    def __init__(self, metrics: EngineMetrics, stream: bool) -> None:
        self.metrics = metrics
        self.streaming = {**metrics.tokenizer_labels, "is_streaming": "true" if stream else "false"}
        self.started = time.monotonic()
        self.first: float | None = None
        self.last: float | None = None

    def token(self) -> None:
        """One output token left the engine."""
        now = time.monotonic()
        if self.first is None:
            self.first = now
            if self.metrics.role != "prefill":  # PD prefill workers never observe TTFT (nor ITL)
                self.metrics.ttft.labels(**self.streaming).observe(now - self.started)
        elif self.metrics.role != "prefill" and self.last is not None:
            self.metrics.itl.labels(**self.metrics.tokenizer_labels).observe(now - self.last)
        self.last = now

    def finish(self, prompt_tokens: int, output_tokens: int) -> None:
        m, now = self.metrics, time.monotonic()
        m.prompt_tokens.labels(**self.streaming).inc(prompt_tokens)
        m.generation_tokens.labels(**self.streaming).inc(output_tokens)
        m.requests.labels(**self.streaming).inc()
        m.e2e.labels(**self.streaming).observe(now - self.started)
        if m.role != "prefill" and self.first is not None and output_tokens > 1:
            m.tpot.labels(**self.streaming).observe((now - self.first) / (output_tokens - 1))
