"""The simulator's HTTP server: SGLang's worker endpoints that smg PD mode and validation use.

Timing model: a prefill costs `ttft_s`, every output token `tpot_s`. In PD mode the prefill-role
instance spends the TTFT and then releases the bootstrap room; the decode-role instance waits for
that room (through the prefill's bootstrap port, as SGLang's decode waits for the KV transfer)
and then streams the tokens. Like SGLang's, the prefill answers once the decode took the room, and
fails the request (500) when no decode does within SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT; the
decode's wait is bounded by its waiting timeout and a heartbeat (pd_standins.engine.bootstrap).
Output text and token counts are decided by pd_standins.engine.text.

Running requests: like SGLang's scheduler, at most --max-running-requests requests run at once
(a decode request from the moment its KV arrived, a prefill or plain request from the start); the
others wait in the queue. sglang:num_running_reqs and sglang:num_queue_reqs report both, so a cap
below the client's concurrency shows on /metrics as it does on a real decode worker whose KV pool
is too small. When the engine sized its KV pool (pd_standins.engine.kv_pool), a request also needs
its pages of the pool (the decode takes them before it bootstraps, as SGLang's prealloc queue
does), so a small pool caps the running requests on its own.

KV transfer: a PD worker also opens one port per TP rank (pd_standins.engine.transfer); the decode
asks the prefill's rank ports for each room's KV and the prefill answers on the decode's, so both
directions must be reachable, as with SGLang's ZMQ sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pd_standins import __version__
from pd_standins.engine import SIMULATOR_BANNER, SIMULATOR_HEADER, SIMULATOR_NAME, TRACE_STAND_IN
from pd_standins.engine.bootstrap import (
    ROOM_TTL_S,
    BootstrapRooms,
    PdTimeouts,
    RendezvousError,
    rendezvous,
)
from pd_standins.engine.kv_pool import UNSIZED_MAX_RUNNING_REQUESTS, TokenPool, request_tokens
from pd_standins.engine.metrics import EngineMetrics, RequestMetrics
from pd_standins.engine.release import describe, header_value
from pd_standins.engine.text import CannedCompletions, Completion, TokenCounter, complete
from pd_standins.engine.transfer import RankPorts, TransferError, local_ip

UNGUARDED_PATHS = frozenset({"/health", "/health_generate", "/ready", "/metrics"})
ROLES = ("null", "prefill", "decode")


@dataclass
class SimConfig:
    """Everything the simulator is told; SGLang's flag names where one exists."""

    role: str = "null"
    host: str = "127.0.0.1"
    port: int = 30000
    bootstrap_port: int = 8998
    model_path: str = "simulated-model"
    served_model_name: str | None = None
    tp_size: int = 1
    api_key: str | None = None
    context_length: int = 65536
    max_running_requests: int | None = 256
    # The KV pool's tokens (pd_standins.engine.kv_pool); None = not sized, no token admission.
    max_total_num_tokens: int | None = None
    enable_metrics: bool = True
    ttft_s: float = 0.05
    tpot_s: float = 0.002
    startup_delay_s: float = 0.0
    rendezvous_timeout_s: float = 30.0
    pd: PdTimeouts = field(default_factory=PdTimeouts)
    profile_dir: str | None = None
    canned: CannedCompletions = field(default_factory=CannedCompletions)
    # The interpreter the real engine would run from (its venv is the release's SGLang build).
    sglang_python: str | None = None
    # The whole command line when started as a program (pd_standins.engine.startup reads it).
    launch_args: Any = None

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path


class BadRequest(ValueError):
    """A request the simulator (like SGLang) rejects with 400."""


class TransferFailed(RuntimeError):
    """The prefill's KV never reached a decode (SGLang aborts the request with 500)."""


@dataclass
class _Stats:
    running: int = 0
    requests_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    started: float = field(default_factory=time.monotonic)
    profiling: float | None = None


def _error(status: int, message: str) -> web.Response:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 503: "ServiceUnavailable"}.get(
        status, "Error"
    )
    return web.json_response(
        {"object": "error", "message": message, "type": kind, "code": status}, status=status
    )


class _MeteredRooms(BootstrapRooms):
    """The prefill's rooms, timed from prefilled to handed to the decode (SGLang's prefill observes
    sglang:kv_transfer_latency_ms); rooms prefilled and not yet taken are the inflight queue."""

    def __init__(self, wait_timeout_s: float) -> None:
        super().__init__(wait_timeout_s)
        self.metrics: EngineMetrics | None = None
        self.ready_at: dict[int, float] = {}

    def mark_ready(self, room: int, prompt_tokens: int) -> None:
        now = time.monotonic()
        for key in [k for k, t in self.ready_at.items() if now - t > ROOM_TTL_S]:
            del self.ready_at[key]
        self.ready_at[room] = now
        super().mark_ready(room, prompt_tokens)

    async def wait(self, room: int) -> int | None:
        tokens = await super().wait(room)
        ready = self.ready_at.pop(room, None)
        if tokens is not None and ready is not None and self.metrics is not None:
            self.metrics.kv_transfer(time.monotonic() - ready)
        return tokens

    async def taken(self, room: int, timeout_s: float) -> bool:
        if not await super().taken(room, timeout_s):
            self.ready_at.pop(room, None)  # SGLang drops a timed-out request from the inflight queue
            return False
        return True


class SimWorker:
    """One simulated SGLang worker (prefill, decode or plain)."""

    def __init__(self, config: SimConfig) -> None:
        if config.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {config.role!r}")
        self.config = config
        self.rooms = _MeteredRooms(config.rendezvous_timeout_s)
        self.stats = _Stats()
        self.decode_waiting = 0
        self.queued = 0
        if config.max_running_requests is None:
            config.max_running_requests = UNSIZED_MAX_RUNNING_REQUESTS
        self.slots = asyncio.Semaphore(max(1, int(config.max_running_requests)))
        self.kv = TokenPool(config.max_total_num_tokens) if config.max_total_num_tokens else None
        self.tokens = TokenCounter.for_model(config.model_path)
        self.sglang_metrics = EngineMetrics(
            config.role,
            config.model_name,
            running=lambda: float(self.stats.running),
            transfer_queue=lambda: float(
                len(self.rooms.ready_at) if config.role == "prefill" else self.decode_waiting
            ),
            queued=lambda: float(self.queued),
        )
        self.rooms.metrics = self.sglang_metrics
        # The per-TP-rank transfer ports of a PD worker (opened by serve()).
        self.transfer: RankPorts | None = None
        self.release = describe(config.sglang_python, config.model_path)
        self.stamp = f"{SIMULATOR_BANNER}; role={config.role}; {header_value(self.release)}"

    # ---- plumbing -------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ready", self.health)
        r.add_get("/health_generate", self.health_generate)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/metrics", self.metrics)
        r.add_post("/start_profile", self.start_profile)
        r.add_post("/stop_profile", self.stop_profile)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        guarded = self.config.api_key and request.path not in UNGUARDED_PATHS
        if guarded and request.headers.get("Authorization", "") != f"Bearer {self.config.api_key}":
            response: web.StreamResponse = _error(401, "missing or wrong Bearer API key")
            self._stamp(response)
            return response
        try:
            response = await handler(request)
        except BadRequest as exc:
            response = _error(400, str(exc))
        except RendezvousError as exc:
            response = _error(502, f"decode could not pair with prefill: {exc}")
        except TransferFailed as exc:
            response = _error(500, str(exc))
        except TransferError as exc:
            response = _error(500, str(exc))
        self._stamp(response)
        return response

    def _stamp(self, response: web.StreamResponse) -> None:
        if not response.prepared:
            response.headers[SIMULATOR_HEADER] = self.stamp
            response.headers["Server"] = SIMULATOR_BANNER

    def _headers(self) -> dict[str, str]:
        return {SIMULATOR_HEADER: self.stamp, "Server": SIMULATOR_BANNER}

    def _loading(self) -> bool:
        return time.monotonic() - self.stats.started < self.config.startup_delay_s

    # ---- informational endpoints ----------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self._loading():
            return web.Response(status=503, text="loading (simulated startup delay)")
        return web.Response(status=200, text="")

    async def health_generate(self, request: web.Request) -> web.Response:
        if self._loading():
            return web.Response(status=503, text="loading (simulated startup delay)")
        await asyncio.sleep(self.config.ttft_s + self.config.tpot_s)
        return web.Response(status=200, text="")

    def _server_info(self) -> dict[str, Any]:
        c = self.config
        return {
            "simulator": True,
            "engine": SIMULATOR_NAME,
            "engine_banner": SIMULATOR_BANNER,
            "version": f"{SIMULATOR_NAME}-{__version__}",
            "model_path": c.model_path,
            "tokenizer_path": c.model_path,
            "served_model_name": c.model_name,
            "tp_size": c.tp_size,
            "dp_size": 1,
            "disaggregation_mode": c.role,
            "disaggregation_bootstrap_port": c.bootstrap_port,
            "disaggregation_transfer_backend": "simulated",
            "max_running_requests": c.max_running_requests,
            "max_total_num_tokens": c.max_total_num_tokens,
            "context_length": c.context_length,
            "enable_metrics": c.enable_metrics,
            "sim_ttft_ms": c.ttft_s * 1000,
            "sim_tpot_ms": c.tpot_s * 1000,
            "sim_canned_prefixes": [prefix for prefix, _ in c.canned.entries],
            "stands_in_for": self.release,
            "internal_states": [
                {"simulator": True, "last_gen_throughput": 0.0, "avg_spec_accept_length": None}
            ],
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._server_info())

    async def model_info(self, request: web.Request) -> web.Response:
        c = self.config
        return web.json_response(
            {
                "simulator": True,
                "model_path": c.model_path,
                "tokenizer_path": c.model_path,
                "served_model_name": c.model_name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "simulated",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "simulated",
                "architectures": ["Simulated"],
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        c = self.config
        card = {
            "id": c.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": c.model_path,
            "max_model_len": c.context_length,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed (simulated).\n")

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.config.enable_metrics:
            return web.Response(status=404, text="metrics disabled (--enable-metrics not given)\n")
        return web.Response(
            body=self.sglang_metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    # ---- profiling (SGLang's /start_profile, /stop_profile) -------------------------------
    async def start_profile(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        if isinstance(body, dict) and body.get("output_dir"):
            self.config.profile_dir = str(body["output_dir"])
        self.stats.profiling = time.time()
        return web.Response(text="Start profiling (simulated: no GPU kernels exist here).\n")

    async def stop_profile(self, request: web.Request) -> web.Response:
        if self.stats.profiling is None:
            raise BadRequest("profiling was not started (POST /start_profile first)")
        started, self.stats.profiling = self.stats.profiling, None
        out = (
            Path(self.config.profile_dir or ".")
            / f"simulated-{self.config.role}-{int(started)}.trace.json.gz"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        events = [
            {"ph": "X", "cat": "kernel", "name": name, "ts": i * 10.0, "dur": dur, "pid": 0, "tid": 0}
            for i, (name, dur) in enumerate(
                [("simulated_sparse_decode_kernel", 630.0), ("simulated_moe_gemv", 250.0)] * 4
                + [("simulated_rmsnorm", 20.0)]
            )
        ]
        # `stand_in` names what wrote the trace, as the day-2 profile report prints it (STAND-IN (...)).
        payload = {
            "simulated": True,
            "engine": SIMULATOR_NAME,
            "stand_in": TRACE_STAND_IN,
            "traceEvents": events,
        }
        out.write_bytes(gzip.compress(json.dumps(payload).encode()))
        return web.Response(text=f"Stop profiling. Simulated trace written to {out}\n")

    # ---- generation -----------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"request body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    @contextlib.asynccontextmanager
    async def _kv_tokens(self, prompt_tokens: int) -> AsyncIterator[None]:
        """The request's pages of the KV pool (kv_pool.request_tokens), held until it finishes; a prompt
        larger than the pool is refused as SGLang's _check_if_req_exceed_kv_capacity refuses it."""
        if self.kv is None:
            yield
            return
        if prompt_tokens > self.kv.total:
            raise BadRequest(
                f"Request exceeds the maximum number of tokens: {prompt_tokens} > {self.kv.total}"
            )
        tokens = min(request_tokens(self.config.role, prompt_tokens), self.kv.total)
        self.queued += 1
        try:
            await self.kv.acquire(tokens)
        finally:
            self.queued -= 1
        try:
            yield
        finally:
            await self.kv.release(tokens)

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        """One of --max-running-requests slots, held while the request runs; waiting is queueing."""
        self.queued += 1
        try:
            await self.slots.acquire()
        finally:
            self.queued -= 1
        self.stats.running += 1
        try:
            yield
        finally:
            self.stats.running -= 1
            self.slots.release()

    async def _run(
        self,
        body: dict[str, Any],
        prompt: str,
        prompt_tokens: int,
        max_tokens: int,
        stack: contextlib.AsyncExitStack,
    ) -> Completion:
        """Spend the simulated prefill (and the PD rendezvous); return the output to pace. The
        request takes a running slot on `stack` (released when the caller's stack closes)."""
        ignore_eos = bool(body.get("ignore_eos") or (body.get("sampling_params") or {}).get("ignore_eos"))
        role = self.config.role
        rooms = _as_list(body.get("bootstrap_room"))
        # The decode allocates the request's KV before it bootstraps (SGLang's prealloc queue), so a
        # full pool holds the pair back; the others take their pages when they start.
        await stack.enter_async_context(self._kv_tokens(prompt_tokens))
        if role != "decode":
            await stack.enter_async_context(self._running())
        if role == "prefill":
            arrived = time.monotonic()
            await asyncio.sleep(self.config.ttft_s)
            for room in rooms:
                self.rooms.mark_ready(int(room), prompt_tokens)
            for room in rooms:
                left = self.config.pd.bootstrap_timeout_s - (time.monotonic() - arrived)
                if not await self.rooms.taken(int(room), left):
                    self.sglang_metrics.transfer_failure()
                    raise TransferFailed(
                        f"Prefill transfer failed: bootstrap room {room} was not taken by a decode within "
                        f"{self.config.pd.bootstrap_timeout_s:g} s (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)"
                    )
                left = self.config.pd.bootstrap_timeout_s - (time.monotonic() - arrived)
                if self.transfer is not None and not await self.transfer.pushed(int(room), left):
                    self.sglang_metrics.transfer_failure()
                    raise TransferFailed(
                        f"Prefill transfer failed: the KV of bootstrap room {room} could not be sent to the "
                        "decode's rank port (a ZMQ port the OS chose: is it reachable from this host?)"
                    )
            max_tokens = min(max_tokens, 1)  # prefill emits one token; decode streams the rest
        elif role == "decode":
            if not rooms:
                raise BadRequest(
                    "this is a decode-role worker: a request needs bootstrap_host, bootstrap_port and "
                    "bootstrap_room (send it through the router)"
                )
            hosts = _as_list(body.get("bootstrap_host"))
            ports = _as_list(body.get("bootstrap_port"))
            self.decode_waiting += 1
            try:
                for i, room in enumerate(rooms):
                    host = str(hosts[min(i, len(hosts) - 1)]) if hosts else "127.0.0.1"
                    port = ports[min(i, len(ports) - 1)] if ports else None
                    port = int(port) if port is not None else self.config.bootstrap_port
                    started = time.monotonic()
                    _, endpoints = await rendezvous(
                        host, port, int(room), self.config.rendezvous_timeout_s, self.config.pd
                    )
                    if self.transfer is not None:
                        left = self.config.rendezvous_timeout_s - (time.monotonic() - started)
                        await self.transfer.pull(endpoints, int(room), left)
            except (RendezvousError, TransferError):
                self.sglang_metrics.transfer_failure()
                raise
            finally:
                self.decode_waiting -= 1
            await stack.enter_async_context(self._running())
        else:
            await asyncio.sleep(self.config.ttft_s)
        return complete(prompt, max_tokens, self.config.canned, ignore_eos, self.tokens)

    async def _paced(self, tokens: tuple[str, ...], req: RequestMetrics) -> AsyncIterator[str]:
        for i, token in enumerate(tokens):
            if i:
                await asyncio.sleep(self.config.tpot_s)
            req.token()
            yield token

    def _account(self, req: RequestMetrics, prompt_tokens: int, output_tokens: int) -> None:
        req.finish(prompt_tokens, output_tokens)
        self.stats.requests_total += 1
        self.stats.prompt_tokens_total += prompt_tokens
        self.stats.generation_tokens_total += output_tokens

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **self._headers()}
        )
        await response.prepare(request)
        return response

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native POST /generate (text or input_ids; sampling_params.max_new_tokens)."""
        body = await self._body(request)
        if isinstance(body.get("text"), list) or (
            isinstance(body.get("input_ids"), list)
            and body["input_ids"]
            and isinstance(body["input_ids"][0], list)
        ):
            raise BadRequest("batched /generate is not simulated; send one prompt per request")
        if "text" in body:
            prompt = str(body["text"])
            prompt_tokens = self.tokens.count(prompt)
        elif isinstance(body.get("input_ids"), list):
            prompt = " ".join(str(t) for t in body["input_ids"])
            prompt_tokens = max(1, len(body["input_ids"]))
        else:
            raise BadRequest("/generate needs 'text' or 'input_ids'")
        params = body.get("sampling_params") or {}
        max_tokens = _int(params.get("max_new_tokens", 128), "sampling_params.max_new_tokens")
        rid = str(body.get("rid") or uuid.uuid4().hex)
        req = self.sglang_metrics.request(bool(body.get("stream")))
        async with contextlib.AsyncExitStack() as stack:
            started = time.monotonic()
            result = await self._run(body, prompt, prompt_tokens, max_tokens, stack)

            def meta(done: int, final: bool) -> dict[str, Any]:
                info: dict[str, Any] = {
                    "id": rid,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done,
                    "cached_tokens": 0,
                    "finish_reason": {"type": result.finish_reason} if final else None,
                    "e2e_latency": time.monotonic() - started,
                    "simulated": True,
                }
                if final and result.finish_reason == "length":
                    info["finish_reason"]["length"] = done
                return info

            if not body.get("stream"):
                async for _ in self._paced(result.tokens, req):
                    pass
                self._account(req, prompt_tokens, len(result.tokens))
                text = "".join(result.tokens)
                return web.json_response(
                    {
                        "text": text,
                        "output_ids": list(range(len(result.tokens))),
                        "meta_info": meta(len(result.tokens), True),
                    }
                )
            response = await self._sse(request)
            text, done = "", 0
            async for token in self._paced(result.tokens, req):
                text += token
                done += 1
                final = done == len(result.tokens)
                chunk = {
                    "text": text,
                    "output_ids": list(range(done)),
                    "meta_info": meta(done, final),
                    "index": 0,
                }
                await response.write(_event(chunk))
            if not result.tokens:
                await response.write(
                    _event({"text": "", "output_ids": [], "meta_info": meta(0, True), "index": 0})
                )
            await response.write(b"data: [DONE]\n\n")
            self._account(req, prompt_tokens, done)
            await response.write_eof()
            return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise BadRequest("a list prompt with more than one entry is not simulated")
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("/v1/completions needs a string 'prompt'")
        return await self._openai(request, body, prompt, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("/v1/chat/completions needs a non-empty 'messages' list")
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        last = users[-1] if users else messages[-1]
        content = last.get("content", "") if isinstance(last, dict) else ""
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return await self._openai(request, body, str(content), chat=True)

    async def _openai(
        self, request: web.Request, body: dict[str, Any], prompt: str, chat: bool
    ) -> web.StreamResponse:
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_new_tokens")
        max_tokens = _int(limit if limit is not None else (128 if chat else 16), "max_tokens")
        prompt_tokens = self.tokens.count(prompt)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        model = str(body.get("model") or self.config.model_name)
        req = self.sglang_metrics.request(bool(body.get("stream")))
        async with contextlib.AsyncExitStack() as stack:
            result = await self._run(body, prompt, prompt_tokens, max_tokens, stack)

            def usage(done: int) -> dict[str, int]:
                return {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done,
                    "total_tokens": prompt_tokens + done,
                }

            if not body.get("stream"):
                async for _ in self._paced(result.tokens, req):
                    pass
                self._account(req, prompt_tokens, len(result.tokens))
                text = "".join(result.tokens)
                choice: dict[str, Any] = {"index": 0, "finish_reason": result.finish_reason, "logprobs": None}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                return web.json_response(
                    {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice],
                     "usage": usage(len(result.tokens)), "simulated": True}
                )  # fmt: skip
            response = await self._sse(request)
            chunk_kind = "chat.completion.chunk" if chat else "text_completion"

            def chunk(piece: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
                ch: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
                if chat:
                    ch["delta"] = (
                        {"role": "assistant", "content": piece or ""} if first else {"content": piece}
                    )
                    if finish and piece is None:
                        ch["delta"] = {}
                else:
                    ch["text"] = piece or ""
                return {"id": rid, "object": chunk_kind, "created": created, "model": model, "choices": [ch]}

            if chat:
                await response.write(_event(chunk("", None, first=True)))
            done = 0
            async for token in self._paced(result.tokens, req):
                done += 1
                await response.write(_event(chunk(token, None)))
            await response.write(_event(chunk(None, result.finish_reason)))
            options = body.get("stream_options") or {}
            if options.get("include_usage"):
                await response.write(
                    _event({"id": rid, "object": chunk_kind, "created": created, "model": model,
                            "choices": [], "usage": usage(done)})
                )  # fmt: skip
            await response.write(b"data: [DONE]\n\n")
            self._account(req, prompt_tokens, done)
            await response.write_eof()
            return response


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _int(value: Any, name: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"{name} must be an integer, got {value!r}") from exc
    if number < 0:
        raise BadRequest(f"{name} must be >= 0, got {number}")
    return number


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def serve(
    config: SimConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run the HTTP server (and, for the prefill role, the bootstrap listener) until `stop` is set.
    A port of 0 lets the kernel choose and is written back into `config` before `ready` is set: a
    test that starts the server in-process owns its listening socket instead of guessing a free port."""
    worker = SimWorker(config)
    # A client that goes away aborts its request, as in SGLang (smg drops the other leg of a pair
    # whose first leg failed): without it, aiohttp would keep a decode waiting for a room that
    # will never come until its waiting timeout.
    runner = web.AppRunner(worker.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    if config.port == 0:  # the kernel chose: written back, so the caller reads it once `ready` is set
        config.port = runner.addresses[0][1]
    if config.role in ("prefill", "decode"):
        worker.transfer = RankPorts(local_ip(), config.tp_size)
        await worker.transfer.open()
        worker.rooms.rank_endpoints = worker.transfer.endpoints
    bootstrap = None
    if config.role == "prefill":
        bootstrap = await asyncio.start_server(
            worker.rooms.handle_connection, config.host, config.bootstrap_port
        )
        if config.bootstrap_port == 0:
            config.bootstrap_port = bootstrap.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set()
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        if bootstrap is not None:
            bootstrap.close()
        if worker.transfer is not None:
            worker.transfer.close()
        await runner.cleanup()
