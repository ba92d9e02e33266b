"""Test double: an OpenAI-compatible streaming server with controllable timing and faults.

It stands in for the router + SGLang workers in the client's unit tests (no GPU, no model here)
and, with zero delays, as the "server that streams as fast as it can" of the client-overhead
benchmark. It records, on the server side, when each request arrived and when each content
chunk was written (time.perf_counter, which is CLOCK_MONOTONIC on Linux and so comparable
across processes): an independent measurement to check the client's figures against.

Run standalone: python tests/bench/openai_stream_double.py --port 0 [--tpot-ms 0] -> prints the port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

PROBE_ANSWER = " Paris. It is also the largest city in France."


@dataclass
class DoubleConfig:
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    tokens_per_chunk: int = 1
    probe_answer: str = PROBE_ANSWER
    send_usage: bool = True
    # Faults, by 1-based request number of generation requests (probe included).
    fail_requests: set[int] = field(default_factory=set)  # HTTP 500
    hang_requests: set[int] = field(default_factory=set)  # stream one chunk, then stall forever
    short_requests: set[int] = field(default_factory=set)  # stop one token early (ignored ignore_eos)
    drop_done_requests: set[int] = field(default_factory=set)  # close without [DONE]
    not_ready_polls: int = 0  # /readiness answers 503 this many times first
    # Requests generating at once (like SGLang's --max-running-requests); the rest wait. 0 = no cap.
    max_running: int = 0


@dataclass
class ServerRecord:
    received: float
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0
    finished: float = 0.0


class OpenAIStreamDouble:
    def __init__(self, config: DoubleConfig | None = None) -> None:
        self.config = config or DoubleConfig()
        self.records: list[ServerRecord] = []
        self.requests = 0
        self.readiness_polls = 0
        self.bodies: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.running = 0
        self._slots: asyncio.Semaphore | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/readiness", self._readiness)
        app.router.add_get("/health", self._health)
        app.router.add_get("/server_records", self._server_records)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        """SGLang's running-requests gauge (stats-logging rank 0), the number generating now."""
        labels = 'engine_type="decode",model_name="double-model",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        text = (
            "# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{{{labels}}} {float(self.running)}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        # A short shutdown timeout: a hung-stream fault must not hold the test for a minute.
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "double-model", "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readiness(self, request: web.Request) -> web.Response:
        self.readiness_polls += 1
        if self.readiness_polls <= self.config.not_ready_polls:
            return web.json_response({"status": "not ready"}, status=503)
        return web.json_response({"status": "ready"})

    async def _server_records(self, request: web.Request) -> web.Response:
        rows = [
            {"received": r.received, "chunk_times": r.chunk_times, "tokens": r.tokens, "finished": r.finished}
            for r in self.records
        ]
        return web.json_response(rows)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _tokens(self, prompt: str, max_tokens: int, ignore_eos: bool) -> list[str]:
        if prompt.strip().endswith("The capital of France is"):
            words = [" " + w for w in self.config.probe_answer.split()]
        else:
            words = [" tok"] * max_tokens
        if ignore_eos:
            words = (words * (max_tokens // max(len(words), 1) + 1))[:max_tokens]
        return words[:max_tokens]

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        received = time.perf_counter()
        body = await request.json()
        self.bodies.append(body)
        self.requests += 1
        number = self.requests
        cfg = self.config
        if number in cfg.fail_requests:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        tokens = self._tokens(prompt, int(body.get("max_tokens", 16)), bool(body.get("ignore_eos")))
        if number in cfg.short_requests:
            tokens = tokens[:-1]
        record = ServerRecord(received=received)
        self.records.append(record)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if cfg.max_running and self._slots is None:
            self._slots = asyncio.Semaphore(cfg.max_running)
        if self._slots is not None:
            await self._slots.acquire()
        self.running += 1
        try:
            return await self._stream(response, body, number, tokens, record, chat)
        finally:
            self.running -= 1
            if self._slots is not None:
                self._slots.release()

    async def _stream(
        self,
        response: web.StreamResponse,
        body: dict[str, Any],
        number: int,
        tokens: list[str],
        record: ServerRecord,
        chat: bool,
    ) -> web.StreamResponse:
        cfg = self.config
        if cfg.ttft_s:
            await asyncio.sleep(cfg.ttft_s)
        step = max(cfg.tokens_per_chunk, 1)
        for start in range(0, len(tokens), step):
            if start and cfg.tpot_s:
                await asyncio.sleep(cfg.tpot_s * step)
            piece = "".join(tokens[start : start + step])
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            await response.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
            record.chunk_times.append(time.perf_counter())
            record.tokens += len(tokens[start : start + step])
            if number in cfg.hang_requests:
                await asyncio.sleep(3600)
        if cfg.send_usage and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 8, "completion_tokens": len(tokens), "total_tokens": 8 + len(tokens)}
            await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        if number not in cfg.drop_done_requests:
            await response.write(b"data: [DONE]\n\n")
        record.finished = time.perf_counter()
        await response.write_eof()
        return response


async def _serve_forever(args: argparse.Namespace) -> None:
    double = OpenAIStreamDouble(
        DoubleConfig(
            ttft_s=args.ttft_ms / 1000,
            tpot_s=args.tpot_ms / 1000,
            tokens_per_chunk=args.tokens_per_chunk,
            probe_answer=args.probe_answer,
            fail_requests=_numbers(args.fail_requests),
            hang_requests=_numbers(args.hang_requests),
            max_running=args.max_running,
        )
    )
    await double.start(port=args.port)
    print(double.port, flush=True)
    await asyncio.Event().wait()


def _numbers(text: str) -> set[int]:
    return {int(n) for n in text.split(",") if n.strip()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--tpot-ms", type=float, default=0.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--probe-answer", default=PROBE_ANSWER)
    parser.add_argument("--fail-requests", default="", help="request numbers answered HTTP 500, e.g. 3,7")
    parser.add_argument("--hang-requests", default="", help="request numbers that stall after one chunk")
    parser.add_argument("--max-running", type=int, default=0, help="requests generating at once (0: no cap)")
    args = parser.parse_args(argv)
    asyncio.run(_serve_forever(args))


if __name__ == "__main__":
    main(sys.argv[1:])
