"""The asyncio streaming client: probe, warm-up and closed-loop measured phases.

One aiohttp session per phase with a connection pool as wide as the concurrency, SSE parsed
line by line, a timestamp taken as each line arrives. The hot loop does one json.loads per
chunk and nothing else, so the client stays far from being the bottleneck (see
benchmarks/bench_client_overhead.py for the measured ceiling).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from pd_appliance.bench.decode_metrics import RunningSampler
from pd_appliance.bench.metrics import PhaseMetrics, RequestRecord, compute_phase
from pd_appliance.bench.steady import Wave, launch_more, split_waves, warmup_done
from pd_appliance.bench.workload import API_PATHS, Workload

# Read buffer for the stream: a chunk line is a few hundred bytes; 1 MiB avoids
# "line too long" on servers that send large usage/meta payloads.
_READ_BUFSIZE = 1 << 20


@dataclass(frozen=True)
class Endpoint:
    """Where and how to reach the OpenAI-compatible server."""

    base_url: str
    model: str
    api_key: str = ""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def url(self, api: str) -> str:
        return self.base_url.rstrip("/") + API_PATHS[api]


def build_payload(
    api: str, model: str, prompt: str, max_tokens: int, ignore_eos: bool, thinking: bool = False
) -> dict[str, Any]:
    """The request body: greedy, streamed, with the usage report so tokens are counted exactly.

    On the chat API the chat template's thinking mode is set explicitly (`thinking` for DeepSeek's
    templates, `enable_thinking` for Qwen's), so a template's own default cannot change what is
    measured; the completions API sends the raw prompt, with no template to ask.
    """
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    if api == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
        payload["chat_template_kwargs"] = {"thinking": thinking, "enable_thinking": thinking}
    else:
        payload["prompt"] = prompt
    return payload


def _chunk_text(data: dict[str, Any]) -> str:
    choices = data.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    # Reasoning models stream their thinking in reasoning_content: it is generated output too.
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


def _apply_line(record: RequestRecord, line: bytes, now: float, texts: list[str]) -> bool:
    """Fold one SSE line into `record`; returns True on `data: [DONE]`."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return False  # blank separators, ": keep-alive" comments, event: lines
    body = line[5:].strip()
    if body == b"[DONE]":
        return True
    data = json.loads(body)
    if "error" in data and not data.get("choices"):
        error = data["error"]
        record.error = "server error: " + (
            error.get("message", str(error)) if isinstance(error, dict) else str(error)
        )
        return True
    text = _chunk_text(data)
    if text:
        record.chunk_times.append(now)
        texts.append(text)
    usage = data.get("usage") or {}
    if usage.get("completion_tokens") is not None:
        record.output_tokens = int(usage["completion_tokens"])
        record.token_count_source = "usage"
    return False


async def _stream(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], record: RequestRecord
) -> None:
    texts: list[str] = []
    done = False
    async with session.post(url, json=payload) as response:
        if response.status != 200:
            body = (await response.text())[:300]
            record.error = f"HTTP {response.status}: {body}"
            return
        async for line in response.content:
            now = time.perf_counter()
            record.end = now
            if _apply_line(record, line, now, texts):
                done = True
                break
    record.text = "".join(texts)
    if record.error:
        return
    if record.token_count_source != "usage":
        record.output_tokens = len(record.chunk_times)
    if not done:
        record.error = "stream ended before 'data: [DONE]'"
    elif not record.chunk_times:
        record.error = "stream carried no generated text"


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    timeout_s: float,
    expected_tokens: int | None = None,
) -> RequestRecord:
    """Send one streamed request and time it; every failure (timeout included) becomes `error`."""
    record = RequestRecord(start=time.perf_counter())
    try:
        await asyncio.wait_for(_stream(session, url, payload, record), timeout_s)
    except asyncio.TimeoutError:
        record.error = f"timeout: no complete answer within {timeout_s:g} s"
    except (aiohttp.ClientError, OSError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    except (ValueError, KeyError, TypeError) as exc:
        record.error = f"malformed stream: {type(exc).__name__}: {exc}"
    if not record.end or record.end < record.start:
        record.end = time.perf_counter()
    if (
        not record.error
        and expected_tokens is not None
        and record.token_count_source == "usage"
        and record.output_tokens != expected_tokens
    ):
        record.error = (
            f"expected {expected_tokens} output tokens, got {record.output_tokens} "
            "(does the server honour ignore_eos?)"
        )
    return record


def _session(concurrency: int, headers: dict[str, str]) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=max(concurrency, 1), limit_per_host=max(concurrency, 1))
    return aiohttp.ClientSession(
        connector=connector,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        read_bufsize=_READ_BUFSIZE,
    )


@dataclass
class SteadyPhase:
    """One level measured to a steady state: its figures, its measured records and waves."""

    metrics: PhaseMetrics
    records: list[RequestRecord]
    waves: list[Wave]
    warmup_completed: int
    sent: int


@dataclass
class _Loop:
    """The state of one level's closed loop: what was sent and completed (decisions: steady.py)."""

    workload: Workload
    sampler: RunningSampler | None
    sent: int = 0
    completed: list[RequestRecord] = field(default_factory=list)
    warmup_count: int | None = None
    warmup_end: float = 0.0

    def measured(self) -> list[RequestRecord]:
        return self.completed[self.warmup_count :] if self.warmup_count is not None else []

    def may_send(self) -> bool:
        """Send another request: always while warming up, then as steady.launch_more says."""
        if self.warmup_count is None:
            return True
        w = self.workload
        errors = sum(1 for r in self.measured() if not r.success)
        elapsed = time.perf_counter() - self.warmup_end
        launched = self.sent - self.warmup_count
        return launch_more(
            launched, errors, elapsed, w.concurrency, w.num_requests, w.min_measure_s, w.min_waves
        )

    def complete(self, record: RequestRecord) -> None:
        """Fold in one completion; the one that ends the warm-up starts the measured waves."""
        self.completed.append(record)
        if self.warmup_count is not None:
            return
        w = self.workload
        peak = max(self.sampler.totals) if self.sampler and self.sampler.totals else None
        if warmup_done(len(self.completed), w.warmup_requests, peak, w.concurrency, self.sampler is not None):
            self.warmup_count, self.warmup_end = len(self.completed), record.end
            if self.sampler is not None:
                self.sampler.reset()  # the gate reads the measured waves' running batch only


async def run_phase(
    endpoint: Endpoint,
    workload: Workload,
    prompt_for: Callable[[int], str],
    sampler: RunningSampler | None = None,
) -> SteadyPhase:
    """Run one level as a continuous closed loop until its steady-state waves are measured.

    `prompt_for(i)` is the i-th request's prompt (warm-up included). Every request sent is awaited,
    so the last wave ends as the loop drains (as the fixed-count phase always did). `sampler` (the
    decode workers' running-requests gauge) runs throughout: the warm-up may wait for it to see a
    full batch, and it is reset when the waves start, so its summary covers the waves only.
    """
    url = endpoint.url(workload.api)
    loop = _Loop(workload, sampler)
    if workload.warmup_requests == 0:  # asked for no warm-up: the waves start with the loop
        loop.warmup_count, loop.warmup_end = 0, time.perf_counter()

    async def worker(session: aiohttp.ClientSession) -> None:
        while loop.may_send():
            index = loop.sent
            loop.sent += 1
            body = build_payload(
                workload.api, endpoint.model, prompt_for(index), workload.output_len, True, workload.thinking
            )
            loop.complete(
                await stream_request(session, url, body, workload.request_timeout_s, workload.output_len)
            )

    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop)) if sampler is not None else None
    try:
        async with _session(workload.concurrency, endpoint.headers) as session:
            await asyncio.gather(*(worker(session) for _ in range(workload.concurrency)))
    finally:
        stop.set()
        if sampling is not None:
            await sampling
    measured = loop.measured()
    waves = split_waves(measured, loop.warmup_end, workload.concurrency)
    wall = max((r.end for r in measured), default=loop.warmup_end) - loop.warmup_end
    metrics = compute_phase(measured, workload.concurrency, wall)
    return SteadyPhase(metrics, measured, waves, loop.warmup_count or 0, loop.sent)


async def probe(
    endpoint: Endpoint,
    prompt: str,
    expect: str,
    api: str = "completions",
    max_tokens: int = 16,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Greedy-decode `prompt` and check that `expect` appears in the answer (case-insensitive).

    A server that is fast but wrong (bad kernel, wrong checkpoint, broken KV transfer) fails here
    before any timing, so it can never pass the gates.
    """
    payload = build_payload(api, endpoint.model, prompt, max_tokens, ignore_eos=False)
    async with _session(1, endpoint.headers) as session:
        record = await stream_request(session, endpoint.url(api), payload, timeout_s)
    passed = not record.error and expect.lower() in record.text.lower()
    return {
        "passed": passed,
        "api": api,
        "prompt": prompt,
        "expected": expect,
        "answer": record.text,
        "error": record.error,
        "latency_s": round(record.latency, 4),
    }


async def _workers_verdict(
    session: aiohttp.ClientSession, endpoint: Endpoint, health_path: str, timeout_s: float
) -> tuple[bool, str] | None:
    """Do a prefill and a decode the router routes to answer their health URL now?

    smg lists its workers at GET /workers. None when the router lists none (404: not smg), so its
    /readiness is the only word; smg's /readiness alone stays 200 while a restarting worker is
    within the serving role's outage grace (pd_appliance.serving.readiness says why).
    """
    from pd_appliance.serving.readiness import verdict

    url = endpoint.base_url.rstrip("/") + "/workers"
    try:
        async with session.get(url) as response:
            if response.status == 404:
                return None
            if response.status != 200:
                return False, f"/workers: HTTP {response.status}"
            listed = (await response.json()).get("workers") or []
    except (aiohttp.ClientError, OSError, ValueError, AttributeError) as exc:
        return False, f"/workers: {type(exc).__name__}: {exc}"
    workers = [
        {"url": w["url"], "worker_type": w.get("worker_type"), "router_healthy": w.get("is_healthy")}
        for w in listed
        if isinstance(w, dict) and w.get("url")
    ]

    async def health(worker: dict[str, Any]) -> None:
        try:
            async with session.get(
                worker["url"].rstrip("/") + health_path, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                worker["health"] = {"ok": 200 <= response.status < 300, "status": response.status}
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            worker["health"] = {"ok": False, "error": type(exc).__name__}

    await asyncio.gather(*(health(w) for w in workers))
    return verdict({"ok": True}, workers)


async def wait_ready(
    endpoint: Endpoint, timeout_s: float, interval_s: float = 2.0, worker_health_path: str = "/health"
) -> dict[str, Any]:
    """Poll until the appliance is ready: the router's /readiness answers 200 (smg: a healthy prefill
    and decode) and, where the router lists its workers, a prefill and a decode answer their health.

    A server without /readiness (404) is asked /health instead. Returns what was seen; the
    caller decides whether not being ready is fatal (the probe will fail anyway).
    """
    deadline = time.monotonic() + timeout_s
    last = "not tried"
    paths = ["/readiness", "/health"]
    async with _session(4, endpoint.headers) as session:
        while True:
            for path in list(paths):
                try:
                    async with session.get(endpoint.base_url.rstrip("/") + path) as response:
                        status = response.status
                except (aiohttp.ClientError, OSError) as exc:
                    last = f"{path}: {type(exc).__name__}: {exc}"
                    break
                if status == 200:
                    workers = await _workers_verdict(session, endpoint, worker_health_path, 30.0)
                    if workers is None or workers[0]:
                        return {"ready": True, "path": path, "last": f"{path}: 200"}
                    last = f"{path}: 200, but {workers[1]}"
                    break
                if status == 404 and path == "/readiness":
                    paths.remove(path)
                    continue
                last = f"{path}: HTTP {status}"
                break
            if time.monotonic() >= deadline:
                return {"ready": False, "path": None, "last": last}
            await asyncio.sleep(interval_s)


async def discover_model(endpoint: Endpoint) -> str:
    """The first model id of /v1/models, for when the caller names none."""
    url = endpoint.base_url.rstrip("/") + "/v1/models"
    async with _session(1, endpoint.headers) as session, session.get(url) as response:
        response.raise_for_status()
        data = await response.json()
    models = data.get("data") or []
    if not models:
        raise ValueError(f"{endpoint.base_url}/v1/models lists no model: pass the model name")
    return str(models[0]["id"])
