"""The rehearsal checkpoint's tokenizer, and the engine that counts with it and caps running requests.

The Hub stand-in builds a small byte-level BPE tokenizer.json with the `tokenizers` library (no
file from the Hub); pd-bench builds prompts of exact token length with it and the engine, given
the model directory that holds it, reports the same count. --max-running-requests caps how many
requests run at once, as SGLang's scheduler does, and sglang:num_running_reqs shows the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
from tokenizers import Tokenizer

from pd_appliance.bench.decode_metrics import running_requests
from pd_appliance.bench.workload import prompt_length, synthetic_prompt
from pd_standins.engine.server import SimConfig, serve
from pd_standins.engine.text import CannedCompletions, TokenCounter, complete
from pd_standins.hub import TOKENIZER_WORDS, generate, rehearsal_tokenizer_json


def test_the_tokenizer_is_built_here_deterministically_and_encodes_anything() -> None:
    first, second = rehearsal_tokenizer_json(), rehearsal_tokenizer_json()
    assert first == second
    tokenizer = Tokenizer.from_str(first.decode())
    for word in TOKENIZER_WORDS:
        assert len(tokenizer.encode(" " + word, add_special_tokens=False).ids) == 1, word
    text = "Ünïcode, digits 12345 and words it never saw: zygote!"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text
    for length in (1, 7, 64, 1024):
        assert prompt_length(synthetic_prompt(length, length, tokenizer), tokenizer) == length


def test_the_engine_counts_and_streams_tokens_of_the_model_directory(tmp_path: Path) -> None:
    generate(tmp_path)
    counter = TokenCounter.for_model(str(tmp_path))
    assert counter.tokenizer is not None and str(tmp_path) in counter.source
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    prompt = synthetic_prompt(3, 300, tokenizer)
    assert counter.count(prompt) == 300
    answer = complete(
        "The capital of France is", 40, CannedCompletions.load(), ignore_eos=True, counter=counter
    )
    text = "".join(answer.tokens)
    assert len(answer.tokens) == 40 and text.startswith(" Paris.")
    assert len(tokenizer.encode(text, add_special_tokens=False).ids) == 40  # one chunk, one token
    filler = complete("no canned answer", 12, CannedCompletions.load(), counter=counter).tokens
    assert len(filler) == 12
    assert all(len(tokenizer.encode(t, add_special_tokens=False).ids) == 1 for t in filler)
    assert TokenCounter.for_model(str(tmp_path / "nowhere")).count("x" * 40) == 10  # no tokenizer: ~4 chars


async def _peak_running(max_running: int, concurrency: int) -> tuple[float, float]:
    """The engine's running and queued gauges once every request has arrived: polled on the engine's
    own figures (running + queued == concurrency) while no request has finished yet, not after a sleep
    that a busy machine can make too short (not all arrived) or too long (the first wave done)."""
    config = SimConfig(role="null", port=0, ttft_s=0.01, tpot_s=0.02, max_running_requests=max_running)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, ready=ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 5)
    base = f"http://127.0.0.1:{config.port}"
    # Requests of 10 s: none finishes while the gauges are read, however busy the machine; they are
    # cancelled once read, so the test does not wait them out.
    body = {"model": "m", "prompt": "hello", "max_tokens": 500, "ignore_eos": True}
    finished = 0
    try:
        async with aiohttp.ClientSession() as session:

            async def one() -> None:
                nonlocal finished
                async with session.post(f"{base}/v1/completions", json=body) as response:
                    assert response.status == 200
                    await response.read()
                finished += 1

            requests = asyncio.gather(*(one() for _ in range(concurrency)))
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                async with session.get(f"{base}/metrics") as response:
                    text = await response.text()
                running, queued = running_requests(text), _gauge(text, "sglang:num_queue_reqs")
                if running + queued == concurrency or finished:
                    break
                assert asyncio.get_running_loop().time() < deadline, (running, queued)
                await asyncio.sleep(0.005)
            assert not finished, "a request finished before all had arrived: the figures say nothing"
            requests.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await requests
        return running, queued
    finally:
        stop.set()
        await task


def _gauge(text: str, name: str) -> float:
    return next(s.value for s in _samples(text) if s.name == name)


def _samples(text: str):
    from prometheus_client.parser import text_string_to_metric_families

    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_max_running_requests_caps_the_running_batch_and_queues_the_rest() -> None:
    assert asyncio.run(_peak_running(max_running=6, concurrency=16)) == (6.0, 10.0)
    assert asyncio.run(_peak_running(max_running=256, concurrency=16)) == (16.0, 0.0)
