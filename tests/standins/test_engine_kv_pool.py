"""The rehearsal engine's KV pool: sized as SGLang sizes DeepSeek-V4's, and a small one caps the running
requests on its own (no --max-running-requests), as on a real decode."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from pd_appliance.model import deepseek_v4 as m
from pd_standins.engine import cli, kv_pool
from pd_standins.engine.server import SimConfig
from pd_testlib import DSV4_TEST_CONFIG, FAST_ENGINE_START, reserve_ports, sim_workers

CONFIG = DSV4_TEST_CONFIG
SHAPE = m.DeepSeekV4Shape.from_config(CONFIG)
GPU_MIB = 97887  # the simulated RTX PRO 6000 (pd_standins.gpus)
WORKER = str(Path(sys.executable).parent / "pd-sim-worker")


def _args(*argv: str) -> object:
    return cli.parse_args(["--model-path", "m", *argv])


def _weights_leaving(kv_bytes: int, fraction: float = 0.88, tp: int = 4) -> int:
    """A checkpoint size whose TP share leaves `kv_bytes` of the static memory for the KV pool."""
    return (int(GPU_MIB * kv_pool.MIB * fraction) - kv_bytes) * tp


def test_the_lab_pool_is_the_model_modules_and_far_above_16_requests() -> None:
    args = _args("--tp-size", "4", "--mem-fraction-static", "0.88", "--disaggregation-mode", "decode")
    pool = kv_pool.size(args, "decode", CONFIG, GPU_MIB, 149_000_000_000)
    expected = m.kv_pool(
        SHAPE,
        gpu_memory_bytes=GPU_MIB * kv_pool.MIB,
        mem_fraction_static=0.88,
        weight_bytes=37_250_000_000,
        context_length=65536,
    )
    assert pool == expected and pool.max_running_requests == 4096
    assert pool.max_total_num_tokens // kv_pool.request_tokens("decode", 8192) > 500


def test_explicit_caps_apply_as_in_sglang() -> None:
    capped = kv_pool.size(
        _args("--tp-size", "4", "--mem-fraction-static", "0.88", "--max-running-requests", "6"),
        "decode",
        CONFIG,
        GPU_MIB,
        149_000_000_000,
    )
    assert capped.max_running_requests == 6
    tokens = kv_pool.size(
        _args("--tp-size", "4", "--mem-fraction-static", "0.88", "--max-total-tokens", "10000"),
        "decode",
        CONFIG,
        GPU_MIB,
        149_000_000_000,
    )
    assert tokens.max_total_num_tokens == 9984 and tokens.max_running_requests == 2048  # the estimate's floor


def test_mem_fraction_static_unset_is_derived_from_the_gpu() -> None:
    # RTX PRO 6000 (> 60 GiB): at least 10 GiB reserved; a TP4 prefill reserves 512 + 8192 x 1.5 + 512 MiB.
    assert kv_pool.default_mem_fraction_static(GPU_MIB, "prefill", _args("--tp-size", "4")) == round(
        (GPU_MIB - 13312) / GPU_MIB, 3
    )
    assert kv_pool.default_mem_fraction_static(GPU_MIB, "decode", _args("--tp-size", "4")) == round(
        (GPU_MIB - 10240) / GPU_MIB, 3
    )


def test_no_shape_no_pool_and_no_room_is_sglangs_error() -> None:
    assert kv_pool.size(_args(), "decode", None, GPU_MIB, 0) is None  # a Hub id
    assert kv_pool.size(_args(), "decode", {"architectures": ["DeepseekV4ForCausalLM"]}, GPU_MIB, 0) is None
    with pytest.raises(ValueError, match="increase --mem-fraction-static"):
        kv_pool.size(
            _args("--tp-size", "4", "--mem-fraction-static", "0.5"),
            "decode",
            CONFIG,
            GPU_MIB,
            149_000_000_000 * 2,
        )


def test_decode_admission_is_the_prompts_pages_plus_the_reserved_decode_tokens() -> None:
    assert kv_pool.request_tokens("decode", 1000) == 1024 + 512
    assert kv_pool.request_tokens("decode", 1024) == 1024 + 512
    assert kv_pool.request_tokens("prefill", 1025) == 1280


async def _sixteen_at_once(decode_tokens: int | None, max_running: int | None) -> tuple[int, int, list[int]]:
    bootstrap, p_port, d_port = reserve_ports(3)
    common = {
        "ttft_s": 0.05,
        "tpot_s": 0.02,
        "rendezvous_timeout_s": 30.0,
        "bootstrap_port": bootstrap,
        "served_model_name": "dsv4-flash",
        "enable_metrics": True,
    }
    prefill = SimConfig(role="prefill", port=p_port, **common)
    decode = SimConfig(
        role="decode",
        port=d_port,
        max_total_num_tokens=decode_tokens,
        max_running_requests=max_running,
        **common,
    )
    done = asyncio.Event()
    seen: list[int] = []

    async def watch(session: aiohttp.ClientSession) -> None:
        while not done.is_set():
            async with session.get(f"http://127.0.0.1:{d_port}/metrics") as r:
                text = await r.text()
            seen.extend(
                int(float(line.rsplit(" ", 1)[1]))
                for line in text.splitlines()
                if line.startswith("sglang:num_running_reqs{")
            )
            await asyncio.sleep(0.05)

    async def one(session: aiohttp.ClientSession) -> int:
        body = {
            "input_ids": list(range(1000)),
            "sampling_params": {"max_new_tokens": 20, "ignore_eos": True},
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap,
            "bootstrap_room": random.getrandbits(63),
        }

        async def post(port: int) -> int:
            async with session.post(f"http://127.0.0.1:{port}/generate", json=body) as r:
                await r.read()
                return r.status

        _, status = await asyncio.gather(post(p_port), post(d_port))
        return status

    async with sim_workers(prefill, decode), aiohttp.ClientSession() as session:
        watcher = asyncio.create_task(watch(session))
        started = time.monotonic()
        codes = await asyncio.gather(*(one(session) for _ in range(16)))
        took = time.monotonic() - started
        done.set()
        await watcher
    return max(seen), int(took * 1000), codes


def test_a_small_pool_caps_the_running_requests_without_a_flag() -> None:
    # 8,960 tokens: 5 requests of 1,000 prompt tokens (1,024 + 512 each) at once, never 16.
    peak, _, codes = asyncio.run(_sixteen_at_once(decode_tokens=8960, max_running=None))
    assert codes == [200] * 16
    assert peak == 5
    roomy, _, codes = asyncio.run(_sixteen_at_once(decode_tokens=1_000_000, max_running=None))
    assert codes == [200] * 16 and roomy == 16


def test_the_engine_sizes_its_pool_from_the_model_directory(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    kv_bytes = 64_000_000  # what the weights leave: 64 MB of KV, 9,000 tokens at 7 KB
    with (model / "model-00001-of-00001.safetensors").open("wb") as shard:
        shard.truncate(_weights_leaving(kv_bytes))  # sparse: the size, not the disk
    port = reserve_ports(1)[0]
    env = {
        **os.environ,
        **FAST_ENGINE_START,
        "HOME": str(tmp_path),
        "PD_SIM_WEIGHT_READ_GBPS": "0",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    argv = [
        WORKER,
        "--model-path",
        str(model),
        "--tp-size",
        "4",
        "--mem-fraction-static",
        "0.88",
        "--disaggregation-mode",
        "decode",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
                    info = json.loads(r.read())
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    tokens = int(kv_bytes / m.bytes_per_full_token(SHAPE)) // 256 * 256
    assert info["max_total_num_tokens"] == tokens and info["max_running_requests"] == 2048  # the floor
    assert tokens // kv_pool.request_tokens("decode", 1000) < 16


def test_weights_that_leave_no_room_stop_the_engine(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    env = {
        **os.environ,
        **FAST_ENGINE_START,
        "HOME": str(tmp_path),
        "PD_SIM_WEIGHT_BYTES": str(4 * 90 * 2**30),
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "PD_SIM_WEIGHT_READ_GBPS": "0",
    }
    result = subprocess.run(
        [
            WORKER,
            "--model-path",
            str(tmp_path),
            "--tp-size",
            "4",
            "--mem-fraction-static",
            "0.88",
            "--port",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "ValueError: Not enough memory. Please try to increase --mem-fraction-static" in result.stderr
