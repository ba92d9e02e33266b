"""One variant's measurement: wait for the router, probe, then each concurrency in turn."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pd_appliance.bench import SCHEMA_VERSION
from pd_appliance.bench.client import Endpoint, discover_model, probe, run_phase, wait_ready
from pd_appliance.bench.decode_metrics import RunningSampler
from pd_appliance.bench.metrics import RequestRecord
from pd_appliance.bench.steady import spread
from pd_appliance.bench.workload import (
    CORPUS_FILE,
    PROBE_API,
    PROBE_EXPECT,
    PROBE_PROMPT,
    TokenizerLike,
    Workload,
    WorkloadError,
    load_corpus,
    load_tokenizer,
    prompt_length,
    synthetic_prompt,
)


@dataclass(frozen=True)
class ProbeSpec:
    prompt: str = PROBE_PROMPT
    expect: str = PROBE_EXPECT
    api: str = PROBE_API
    max_tokens: int = 16
    timeout_s: float = 120.0


@dataclass(frozen=True)
class Plan:
    """Everything one `pd-bench run` measures."""

    base_url: str
    workloads: Sequence[Workload]
    model: str = ""
    api_key: str = ""
    tokenizer: str | None = None
    tokenizer_required: bool = True
    probe: ProbeSpec = field(default_factory=ProbeSpec)
    ready_timeout_s: float = 0.0
    ready_poll_interval_s: float = 2.0
    variant: str = "deployed"
    seed: int = 0
    # Each decode worker's /metrics: sglang:num_running_reqs is sampled while each level is measured.
    decode_metrics_urls: Sequence[str] = ()
    metrics_interval_s: float = 1.0


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_from_lists(
    base_url: str,
    concurrencies: Sequence[int],
    num_requests: Sequence[int],
    input_len: int,
    output_len: int,
    warmup_requests: Sequence[int] | None = None,
    api: str = "completions",
    request_timeout_s: float = 600.0,
    min_measure_s: float = 0.0,
    min_waves: int = 1,
    thinking: bool = False,
    **kwargs: Any,
) -> Plan:
    """Build a Plan from per-concurrency lists (one request count per concurrency, or one for all).

    `num_requests` is each level's lower bound on measured requests; `min_measure_s` and
    `min_waves` (the same for every level) extend a level until its spread means something.
    """
    if not concurrencies:
        raise WorkloadError("the concurrency list is empty: give at least one level (e.g. 1 16)")
    if len(set(concurrencies)) != len(concurrencies):
        raise WorkloadError(f"concurrency levels repeat: {list(concurrencies)}")

    def per_level(values: Sequence[int] | None, name: str, default: Sequence[int]) -> list[int]:
        values = list(values) if values else list(default)
        if len(values) == 1:
            values = values * len(concurrencies)
        if len(values) != len(concurrencies):
            raise WorkloadError(
                f"{name} has {len(values)} entries for {len(concurrencies)} concurrency levels: "
                "give one, or one each"
            )
        return values

    counts = per_level(num_requests, "num_requests", [])
    warmups = per_level(warmup_requests, "warmup_requests", list(concurrencies))
    workloads = [
        Workload(c, n, input_len, output_len, w, api, request_timeout_s, min_measure_s, min_waves, thinking)
        for c, n, w in zip(concurrencies, counts, warmups, strict=True)
    ]
    return Plan(base_url=base_url, workloads=workloads, **kwargs)


async def measure(plan: Plan, keep_records: bool = False) -> dict[str, Any]:
    """Measure `plan` and return a JSON-ready dict (raw records under "records" if asked).

    Skips the timing when the probe fails: a wrong answer makes every figure meaningless.
    """
    tokenizer = load_tokenizer(plan.tokenizer, plan.tokenizer_required)
    started = _utc_now()
    endpoint = Endpoint(plan.base_url, plan.model, plan.api_key)
    ready: dict[str, Any] = {"ready": None, "path": None, "last": "not waited"}
    if plan.ready_timeout_s > 0:
        ready = await wait_ready(endpoint, plan.ready_timeout_s, plan.ready_poll_interval_s)
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "variant": plan.variant,
        "target_url": plan.base_url,
        "started_at": started,
        "ready": ready,
        "input_len_unit": "tokens" if tokenizer is not None else "characters",
        "tokenizer": plan.tokenizer if tokenizer is not None else None,
        "workloads": [w.as_dict() for w in plan.workloads],
        # Fixed for every request, so two runs differ only in the server: printed in the report.
        "request_settings": {
            "temperature": 0.0,
            "ignore_eos": True,
            "thinking": any(w.thinking for w in plan.workloads),
            "prompt_corpus": f"{CORPUS_FILE} ({len(load_corpus())} passages)",
        },
        "phases": [],
    }
    try:
        model = plan.model or await discover_model(endpoint)
    except Exception as exc:  # any failure here means the server cannot be measured
        result.update(
            model=plan.model,
            probe={"passed": False, "error": f"cannot list models: {type(exc).__name__}: {exc}"},
        )
        result["finished_at"] = _utc_now()
        return result
    endpoint = Endpoint(plan.base_url, model, plan.api_key)
    result["model"] = model
    p = plan.probe
    result["probe"] = await probe(endpoint, p.prompt, p.expect, p.api, p.max_tokens, p.timeout_s)
    records: dict[str, list[dict[str, Any]]] = {}
    if result["probe"]["passed"]:
        offset = 0  # prompt indices run on across levels: no level reuses another's prompts
        for workload in plan.workloads:
            phase, raw = await _measure_level(endpoint, plan, workload, offset, tokenizer)
            offset += phase["sent"]
            result["phases"].append(phase)
            if keep_records:
                records[str(workload.concurrency)] = [_record_dict(r) for r in raw]
    if keep_records:
        result["records"] = records
    result["finished_at"] = _utc_now()
    return result


async def _measure_level(
    endpoint: Endpoint, plan: Plan, workload: Workload, offset: int, tokenizer: TokenizerLike | None
) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One level to a steady state from prompt `offset` on: its figures, waves and spread, and its
    measured records."""

    @functools.cache
    def prompt_for(index: int) -> str:
        return synthetic_prompt(offset + index, workload.input_len, tokenizer, plan.seed)

    # Built before the clock starts, as they always were; a longer run builds the rest as it goes.
    for index in range(workload.warmup_requests + workload.num_requests + workload.concurrency):
        prompt_for(index)
    phase_start = time.time()
    urls = plan.decode_metrics_urls
    sampler = RunningSampler(urls, plan.metrics_interval_s) if urls else None
    steady_phase = await run_phase(endpoint, workload, prompt_for, sampler)
    phase = steady_phase.metrics.as_dict()
    phase["started_at_unix"] = round(phase_start, 3)
    phase["input_len_measured"] = prompt_length(prompt_for(0), tokenizer)
    phase["decode_running"] = sampler.summary(workload.concurrency) if sampler else None
    phase["waves"] = [round(w.output_tok_s, 3) for w in steady_phase.waves]
    phase["spread"] = spread(steady_phase.waves)
    phase["warmup_completed"] = steady_phase.warmup_completed
    phase["sent"] = steady_phase.sent
    return phase, steady_phase.records


def _record_dict(record: RequestRecord) -> dict[str, Any]:
    return {
        "start": record.start,
        "end": record.end,
        "chunk_times": record.chunk_times,
        "output_tokens": record.output_tokens,
        "token_count_source": record.token_count_source,
        "error": record.error,
    }


def measure_sync(plan: Plan, keep_records: bool = False) -> dict[str, Any]:
    return asyncio.run(measure(plan, keep_records))
