"""The rehearsal engine's /metrics against SGLang 0.5.23: the same names, kinds, labels and buckets,
and values that follow the PD request path (TTFT and TPOT on decode only, KV handoff on prefill)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import aiohttp
import pytest
from monitoring_testlib import find_sglang_wheel, parse_samples, value, wheel_metrics
from prometheus_client.parser import text_string_to_metric_families

from pd_standins.engine.server import SimConfig, SimWorker
from pd_testlib import sim_workers

BASE_LABELS = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "simulated"}


@pytest.fixture(scope="module")
def sglang_metrics() -> dict:
    wheel = find_sglang_wheel()
    if wheel is None:
        pytest.skip("the sglang 0.5.23 wheel is absent (make wheels)")
    return wheel_metrics(Path(wheel))


@pytest.mark.parametrize("role", ["prefill", "decode", "null"])
def test_every_sglang_series_is_defined_alike_in_the_wheel(role: str, sglang_metrics: dict) -> None:
    """Each metric object of the engine (series or not yet) against the wheel's definition."""
    worker = SimWorker(SimConfig(role=role, served_model_name="dsv4-flash"))
    names = set()
    for metric in list(worker.sglang_metrics.registry._collector_to_names):
        if metric._name == "pd_sim_worker_info":
            continue
        name = metric._name + "_total" if metric._type == "counter" else metric._name
        names.add(name)
        assert name in sglang_metrics, f"{name} is not a metric of SGLang 0.5.23"
        wheel = sglang_metrics[name]
        assert metric._type == wheel.kind, name
        labels = set(metric._labelnames)
        assert labels - BASE_LABELS == wheel.extra_labels, name
        assert {"model_name", "engine_type", "simulated"} <= labels, name
        if wheel.buckets is not None:
            assert tuple(b for b in metric._upper_bounds if b != float("inf")) == wheel.buckets, name
    assert len(names) >= 9
    # What the exposition says matches: every series of the scrape belongs to one of those metrics.
    for family in text_string_to_metric_families(worker.sglang_metrics.exposition().decode()):
        assert family.name == "pd_sim_worker_info" or family.name in {n.removesuffix("_total") for n in names}


async def _pd_request(stream: bool, max_tokens: int) -> tuple[str, str]:
    # Port 0: the kernel chooses, serve() writes the ports back before `ready`.
    common = {"ttft_s": 0.05, "tpot_s": 0.005, "served_model_name": "dsv4-flash", "port": 0,
              "bootstrap_port": 0}  # fmt: skip
    prefill = SimConfig(role="prefill", **common)
    decode = SimConfig(role="decode", **common)
    async with sim_workers(prefill, decode):
        body = {"model": "dsv4-flash", "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
                "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port,
                "bootstrap_room": random.getrandbits(63)}  # fmt: skip
        async with aiohttp.ClientSession() as session:
            legs = [
                session.post(f"http://127.0.0.1:{c.port}/v1/chat/completions", json=body)
                for c in (prefill, decode)
            ]
            for response in await asyncio.gather(*legs):
                assert response.status == 200
                await response.read()
            texts = []
            for config in (prefill, decode):
                async with session.get(f"http://127.0.0.1:{config.port}/metrics") as r:
                    assert r.headers["Content-Type"].startswith("text/plain; version=")
                    texts.append(await r.text())
        return texts[0], texts[1]


def test_a_pd_request_is_observed_where_sglang_observes_it() -> None:
    prefill_text, decode_text = asyncio.run(_pd_request(stream=True, max_tokens=8))
    prefill, decode = parse_samples(prefill_text), parse_samples(decode_text)
    streaming = {"is_streaming": "true"}
    for samples, engine_type in ((prefill, "prefill"), (decode, "decode")):
        assert value(samples, "sglang:num_requests_total", engine_type=engine_type, **streaming) == 1
        assert value(samples, "sglang:num_requests_total", is_streaming="false") == 0
        assert value(samples, "sglang:e2e_request_latency_seconds_count", **streaming) == 1
        assert value(samples, "sglang:num_running_reqs") == 0
    # Decode: TTFT after the simulated prefill, 7 inter-token gaps, one TPOT near the simulated 5 ms.
    assert value(decode, "sglang:time_to_first_token_seconds_count", **streaming) == 1
    assert value(decode, "sglang:time_to_first_token_seconds_sum", **streaming) >= 0.05
    assert value(decode, "sglang:inter_token_latency_seconds_count") == 7
    tpot = value(decode, "sglang:request_time_per_output_token_seconds_sum", **streaming)
    assert 0.004 <= tpot < 0.05
    assert value(decode, "sglang:generation_tokens_total", **streaming) == 8
    assert value(decode, "sglang:num_decode_transfer_queue_reqs") == 0
    # Prefill: no TTFT/ITL/TPOT (collect_metrics skips them on a PD prefill), one KV handoff.
    assert "sglang:time_to_first_token_seconds_count" not in prefill
    assert "sglang:inter_token_latency_seconds_count" not in prefill
    assert value(prefill, "sglang:kv_transfer_latency_ms_count") == 1
    assert value(prefill, "sglang:num_prefill_inflight_queue_reqs") == 0
    assert value(prefill, "sglang:num_transfer_failed_reqs_total") == 0


async def _orphan_decode() -> str:
    """A decode request whose prefill never comes: the rendezvous times out, a transfer failure."""
    prefill = SimConfig(role="prefill", port=0, bootstrap_port=0)
    decode = SimConfig(role="decode", port=0, rendezvous_timeout_s=0.3)
    async with sim_workers(prefill, decode):
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": 7}  # fmt: skip
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{decode.port}/generate", json=body) as r:
                assert r.status == 502
            async with session.get(f"http://127.0.0.1:{decode.port}/metrics") as r:
                return await r.text()


def test_a_failed_kv_handoff_counts_as_a_transfer_failure() -> None:
    decode = parse_samples(asyncio.run(_orphan_decode()))
    assert value(decode, "sglang:num_transfer_failed_reqs_total", engine_type="decode") == 1
    assert value(decode, "sglang:num_decode_transfer_queue_reqs") == 0
