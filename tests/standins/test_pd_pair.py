"""A prefill-role and a decode-role pd-sim-worker cooperating through the bootstrap room.

The two real servers run in this process (aiohttp on loopback); requests are sent the way smg's PD
router sends them: the same JSON to both, with bootstrap_host/port/room added.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from pd_standins.engine import SIMULATOR_HEADER
from pd_standins.engine.cli import config_from_args
from pd_standins.engine.server import SimConfig, serve
from pd_standins.engine.text import CannedCompletions
from pd_testlib import sim_workers


class Pair:
    """A prefill and a decode served in-process on ports the kernel chose (port 0, read back by serve)."""

    def __init__(self, ttft_s: float, tpot_s: float, api_key: str | None = None) -> None:
        canned = CannedCompletions.from_mapping({"The capital of France is": " Paris."})
        common = dict(ttft_s=ttft_s, tpot_s=tpot_s, api_key=api_key, canned=canned, rendezvous_timeout_s=2.0,
                      served_model_name="dsv4-flash", port=0, bootstrap_port=0)  # fmt: skip
        self.prefill = SimConfig(role="prefill", **common)
        self.decode = SimConfig(role="decode", **common)

    @property
    def bootstrap(self) -> int:
        return self.prefill.bootstrap_port

    def url(self, config: SimConfig, path: str) -> str:
        return f"http://127.0.0.1:{config.port}{path}"

    def pd_body(self, body: dict) -> dict:
        room = random.getrandbits(63)
        return {
            **body,
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": self.bootstrap,
            "bootstrap_room": room,
        }


@contextlib.asynccontextmanager
async def running_pair() -> AsyncIterator[Pair]:
    p = Pair(ttft_s=0.2, tpot_s=0.005)
    async with sim_workers(p.prefill, p.decode):
        yield p


def with_pair(scenario: Callable[[Pair], Awaitable[None]]) -> Callable[[], None]:
    """Run an async scenario against a fresh prefill/decode pair (no pytest-asyncio needed)."""

    def test() -> None:
        async def main() -> None:
            async with running_pair() as p:
                await scenario(p)

        asyncio.run(main())

    test.__name__, test.__doc__ = scenario.__name__, scenario.__doc__
    return test


async def _pd(
    session: aiohttp.ClientSession, p: Pair, path: str, body: dict
) -> tuple[aiohttp.ClientResponse, bytes]:
    """Send like smg: the same body concurrently to prefill (drained) and decode (returned)."""
    body = p.pd_body(body)

    async def prefill() -> None:
        async with session.post(p.url(p.prefill, path), json=body) as r:
            await r.read()
            assert r.status == 200

    async def decode() -> tuple[aiohttp.ClientResponse, bytes]:
        async with session.post(p.url(p.decode, path), json=body) as r:
            return r, await r.read()

    _, result = await asyncio.gather(prefill(), decode())
    return result


def _events(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().splitlines() if line.startswith("data: ")]


@with_pair
async def test_decode_waits_for_the_prefill_of_its_room(pair: Pair) -> None:
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        response, raw = await _pd(
            session, pair, "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "The capital of France is"}], "max_tokens": 8},
        )  # fmt: skip
        elapsed = time.monotonic() - started
    body = json.loads(raw)
    assert response.status == 200
    assert body["choices"][0]["message"]["content"] == " Paris."
    assert elapsed >= 0.2, "decode answered before the prefill's TTFT elapsed"
    assert (
        "pd-sim-worker" in response.headers[SIMULATOR_HEADER]
        and "role=decode" in response.headers[SIMULATOR_HEADER]
    )


@with_pair
async def test_streaming_chat_ends_with_usage_and_done(pair: Pair) -> None:
    async with aiohttp.ClientSession() as session:
        _, raw = await _pd(
            session, pair, "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True,
             "ignore_eos": True, "stream_options": {"include_usage": True}, "unknown_key": 1},
        )  # fmt: skip
    events = _events(raw)
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 20
    content = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-2]]
    assert sum(1 for c in content if c) == 20


@with_pair
async def test_generate_stream_reports_completion_tokens(pair: Pair) -> None:
    async with aiohttp.ClientSession() as session:
        _, raw = await _pd(
            session, pair, "/generate",
            {"text": "hello", "sampling_params": {"max_new_tokens": 7, "ignore_eos": True}, "stream": True},
        )  # fmt: skip
    events = _events(raw)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert (
        last["meta_info"]["completion_tokens"] == 7 and last["meta_info"]["finish_reason"]["type"] == "length"
    )


@with_pair
async def test_decode_without_prefill_fails_instead_of_inventing_output(pair: Pair) -> None:
    async with aiohttp.ClientSession() as session:
        body = pair.pd_body({"prompt": "x", "max_tokens": 2})  # the prefill never sees this room
        async with session.post(pair.url(pair.decode, "/v1/completions"), json=body) as r:
            assert r.status == 502
            assert "bootstrap room" in (await r.json())["message"]
        async with session.post(pair.url(pair.decode, "/v1/completions"), json={"prompt": "x"}) as r:
            assert r.status == 400 and "bootstrap_room" in (await r.json())["message"]


@with_pair
async def test_info_endpoints_say_simulator_and_speak_smg(pair: Pair) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/server_info", "/get_server_info"):
            async with session.get(pair.url(pair.prefill, path)) as r:
                info = await r.json()
                assert info["simulator"] is True and info["engine"] == "pd-sim-worker"
                assert info["disaggregation_mode"] == "prefill" and info["dp_size"] == 1
                assert info["internal_states"][0]["simulator"] is True
        async with session.get(pair.url(pair.prefill, "/v1/models")) as r:
            assert (await r.json())["data"][0]["owned_by"] == "sglang"
        async with session.get(pair.url(pair.prefill, "/version")) as r:
            assert r.status == 404  # a worker answering /version is taken for vLLM by smg
        async with session.get(pair.url(pair.decode, "/get_model_info")) as r:
            assert (await r.json())["served_model_name"] == "dsv4-flash"
        async with session.get(pair.url(pair.prefill, "/metrics")) as r:
            assert "pd_sim_worker_info" in await r.text()
        for path in ("/health", "/health_generate"):
            async with session.get(pair.url(pair.decode, path)) as r:
                assert r.status == 200 and SIMULATOR_HEADER in r.headers


@with_pair
async def test_bootstrap_port_answers_ping(pair: Pair) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", pair.bootstrap)
    writer.write(b"PING\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"PONG pd-sim-worker")
    writer.close()


def test_api_key_guards_all_but_health() -> None:
    asyncio.run(_api_key_scenario())


async def _api_key_scenario() -> None:
    config = SimConfig(role="null", port=0, api_key="s3cret", ttft_s=0.0, tpot_s=0.0)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, ready=ready, stop=stop))
    await ready.wait()
    url = f"http://127.0.0.1:{config.port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/completions", json={"prompt": "a"}) as r:
                assert r.status == 401 and SIMULATOR_HEADER in r.headers
            headers = {"Authorization": "Bearer s3cret"}
            async with session.post(
                url + "/v1/completions", json={"prompt": "a", "max_tokens": 3}, headers=headers
            ) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 3
            async with session.get(url + "/health") as r:
                assert r.status == 200
    finally:
        stop.set()
        await task


@with_pair
async def test_sixteen_concurrent_streams_are_paced_not_serialised(pair: Pair) -> None:
    tokens = 50
    async with aiohttp.ClientSession() as session:
        # The reference, on this machine now: one stream alone (TTFT + 49 x TPOT, about 0.45 s idle).
        started = time.monotonic()
        await _pd(session, pair, "/v1/completions", _stream_body("alone", tokens))
        alone = time.monotonic() - started
        started = time.monotonic()
        await asyncio.gather(
            *[_pd(session, pair, "/v1/completions", _stream_body(f"p{i}", tokens)) for i in range(16)]
        )
        elapsed = time.monotonic() - started
    # 16 paced in parallel take about one stream's time; serialised they would take 16 x (8.6 x with
    # the TTFTs overlapping). 4 x the reference leaves the machine's load its room and still fails that.
    assert elapsed < 4 * alone, (elapsed, alone)


def _stream_body(prompt: str, tokens: int) -> dict:
    return {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "stream": True}


def test_cli_accepts_sglang_flags_and_reads_env(monkeypatch) -> None:
    monkeypatch.setenv("PD_SIM_TTFT_MS", "120")
    monkeypatch.setenv("PD_SIM_CANNED_COMPLETIONS_JSON", '{"Q": " A"}')
    config, ignored = config_from_args(
        ["--model-path", "/m", "--tp-size", "4", "--disaggregation-mode", "decode", "--port", "1234",
         "--moe-runner-backend", "flashinfer_cutlass", "--trust-remote-code"]
    )  # fmt: skip
    assert config.role == "decode" and config.tp_size == 4 and config.port == 1234
    assert config.ttft_s == pytest.approx(0.12) and config.canned.match("Q?") == " A"
    assert ignored == ["--moe-runner-backend", "flashinfer_cutlass", "--trust-remote-code"]
