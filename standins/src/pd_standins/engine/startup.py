"""The rehearsal engine's start-up, spent as SGLang 0.5.23 spends it, and checked as SGLang checks it.

Before it listens, a real worker (srt/entrypoints/http_server.py launch_server: the HTTP server
starts only once Engine._launch_subprocesses has its schedulers ready) loads its weights, compiles
its kernels on a cold JIT cache, and captures a CUDA graph per decode batch size; then /health
answers 503 (ServerStatus.Starting) until the warm-up request went through. The engine does the
same with time as the only cost, from its inputs:

- weight load: the checkpoint's bytes on disk (the *.safetensors of a local --model-path; none for
  a Hub id) divided by --tp-size (this rank's share), at --sim-weight-read-gbps GB/s per rank;
- JIT compile: --sim-jit-compile-s for each kernel cache of the sm_120 DeepSeek-V4 path (Triton,
  FlashInfer, TileLang: host_contract.cache_locations, jit=True) that holds no marker of a previous
  start; the engine writes the marker into each once it started, so a restart on the same caches is
  warm, as a real one is (the libraries key their caches by kernel and version);
- CUDA-graph capture: --sim-graph-capture-ms-per-bs for each decode batch size SGLang captures
  (decode_capture_batch_sizes below, SGLang's list for --cuda-graph-max-bs-decode); the prefill
  role captures no decode graphs (cuda_graph_hook.apply_cuda_graph_disaggregation_roles) and the
  engine does not simulate prefill graphs;
- warm-up: one request's TTFT + TPOT, /health 503 meanwhile.

Defaults are the lab's expected figures (README "Faults": a decode restart), not measurements:
- weight read 0.75 GB/s per rank: the ~149 GB checkpoint (REFERENCE.md, from the seeds) read once
  from one local NVMe at an assumed 3 GB/s (cold page cache; about half a PCIe Gen4 x4 drive's
  7 GB/s sequential figure), the four ranks of a TP4 instance sharing it: 37 GB per rank, ~50 s;
- graph capture 500 ms per batch size: SGLang issue 10088 logs "Capture cuda graph end. Time
  elapsed: 12.11 s" for a target model's default list (~24 sizes); the lab's decode (max bs 32, no
  speculation) captures 8 sizes, ~4 s;
- JIT compile 60 s per cold cache (inferred: a few nvcc/Triton/TileLang builds each; a lab's first
  start will say).
A rehearsal declares faster ones (standins/declared.yml: serving_env_common, PD_SIM_*).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pd_standins import __version__
from pd_standins.engine.host_contract import CacheLocation, cache_locations

log = logging.getLogger("pd_sim_worker")

WARM_MARKER = "pd-sim-worker.warm"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
# SGLang flags the start-up reads (argparse dest -> SGLang 0.5.23's default, srt/arg_groups/fields/):
# merged into cli.HONOURED.
ENGINE_FLAGS: dict[str, Any] = {
    "base_gpu_id": 0,  # fields/device.py
    "gpu_id_step": 1,  # fields/device.py
    "disaggregation_transfer_backend": "mooncake",  # fields/disagg.py
    "cuda_graph_max_bs_decode": None,  # fields/exec_.py (derived from the GPU's memory)
    "cuda_graph_bs_decode": None,
    "disable_cuda_graph": False,
    "disable_decode_cuda_graph": False,
    "disable_cuda_graph_padding": False,
    "speculative_algorithm": None,  # fields/spec.py
    "mem_fraction_static": None,  # fields/schedule.py (derived from the GPU's memory)
    "max_total_tokens": None,
    "page_size": None,  # DeepSeek-V4: 256 (arg_groups/model_overrides/deepseek_v4.py)
    "chunked_prefill_size": None,
    "max_running_requests": None,  # fields/schedule.py: derived from the KV pool (kv_pool.py)
}

DEFAULT_WEIGHT_READ_GBPS = 0.75
DEFAULT_GRAPH_CAPTURE_MS_PER_BS = 500.0
DEFAULT_JIT_COMPILE_S = 60.0


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"pd-sim-worker: {name}={raw!r} is not a number") from None


def add_knobs(group: Any, env: Mapping[str, str] | None = None) -> None:
    """The start-up rates as --sim-* knobs (defaults from PD_SIM_*, else the lab's expected figures)."""
    env = os.environ if env is None else env
    group.add_argument(
        "--sim-weight-read-gbps",
        type=float,
        default=_env_float(env, "PD_SIM_WEIGHT_READ_GBPS", DEFAULT_WEIGHT_READ_GBPS),
        help="GB/s one TP rank reads its share of the checkpoint at (PD_SIM_WEIGHT_READ_GBPS, "
        f"default {DEFAULT_WEIGHT_READ_GBPS}: the lab's expected; 0 = no time)",
    )
    group.add_argument(
        "--sim-weight-bytes",
        type=float,
        default=_env_float(env, "PD_SIM_WEIGHT_BYTES", -1),
        help="the checkpoint's size in bytes instead of the model directory's weight files "
        "(PD_SIM_WEIGHT_BYTES; the fault suite's lab-length restart)",
    )
    group.add_argument(
        "--sim-jit-compile-s",
        type=float,
        default=_env_float(env, "PD_SIM_JIT_COMPILE_S", DEFAULT_JIT_COMPILE_S),
        help=f"seconds to fill one cold JIT cache (PD_SIM_JIT_COMPILE_S, default {DEFAULT_JIT_COMPILE_S:g})",
    )
    group.add_argument(
        "--sim-graph-capture-ms-per-bs",
        type=float,
        default=_env_float(env, "PD_SIM_GRAPH_CAPTURE_MS_PER_BS", DEFAULT_GRAPH_CAPTURE_MS_PER_BS),
        help="ms to capture one decode CUDA graph (PD_SIM_GRAPH_CAPTURE_MS_PER_BS, default "
        f"{DEFAULT_GRAPH_CAPTURE_MS_PER_BS:g})",
    )


def checkpoint_bytes(model_path: str | None) -> int:
    """Bytes of the weight files of a local model directory (0 for a Hub repository id)."""
    if not model_path or not Path(model_path).is_dir():
        return 0
    return sum(
        p.stat().st_size for p in Path(model_path).iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()
    )


def default_decode_max_bs(gpu_mem_mib: float | None, tp_size: int) -> int:
    """srt/arg_groups/memory_hook.py _handle_gpu_memory_settings: the decode graph's max bs by GPU memory."""
    if gpu_mem_mib is None:
        return 160
    gb = 1024
    if gpu_mem_mib < 20 * gb:
        return 8
    if gpu_mem_mib < 35 * gb:
        return 48 if tp_size < 4 else 160
    if gpu_mem_mib < 60 * gb:
        return 32 if tp_size < 4 else 160
    if gpu_mem_mib < 160 * gb:  # H100/A100 (< 90 GB) and H20/H200/RTX PRO 6000 (< 160 GB) alike
        return 256 if tp_size < 4 else 512
    return 512


def default_chunked_prefill_size(gpu_mem_mib: float | None) -> int:
    """memory_hook._handle_gpu_memory_settings: --chunked-prefill-size by GPU memory."""
    if gpu_mem_mib is None:
        return 4096
    gb = 1024
    if gpu_mem_mib < 20 * gb:
        return 2048
    if gpu_mem_mib < 60 * gb:
        return 4096
    if gpu_mem_mib < 160 * gb:
        return 8192
    return 16384


def decode_capture_batch_sizes(max_bs: int, speculative: bool, disable_padding: bool = False) -> list[int]:
    """srt/arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes, SGLang 0.5.23."""
    if disable_padding:
        sizes = list(range(1, max_bs + 1))
    elif not speculative:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    else:
        sizes = [
            *range(1, 9),
            *range(10, 33, 2),
            *range(40, 65, 4),
            *range(72, 257, 8),
            *range(272, max_bs + 1, 16),
        ]
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def capture_batch_sizes(role: str, args: Any, gpu_mem_mib: float | None) -> list[int]:
    """The decode batch sizes this worker captures (none for a prefill worker or with graphs off)."""
    if role == "prefill" or args.disable_cuda_graph or args.disable_decode_cuda_graph:
        return []
    if args.cuda_graph_bs_decode:
        return sorted(set(int(b) for b in args.cuda_graph_bs_decode))
    max_bs = args.cuda_graph_max_bs_decode
    if max_bs is None:
        max_bs = default_decode_max_bs(gpu_mem_mib, int(args.tp_size))
        # memory_hook: a default max bs never exceeds an explicit --max-running-requests.
        if args.max_running_requests is not None:
            max_bs = min(max_bs, int(args.max_running_requests))
    return decode_capture_batch_sizes(
        int(max_bs), bool(args.speculative_algorithm), args.disable_cuda_graph_padding
    )


@dataclass
class StartupPlan:
    """What this start costs, phase by phase (seconds)."""

    weight_bytes: int = 0
    tp_size: int = 1
    load_s: float = 0.0
    cold_caches: list[CacheLocation] = field(default_factory=list)
    jit_s: float = 0.0
    capture_bs: list[int] = field(default_factory=list)
    capture_s: float = 0.0
    # This rank's KV pool (pd_standins.engine.kv_pool), sized after the weights as SGLang does.
    pool: Any = None

    @property
    def total_s(self) -> float:
        return self.load_s + self.jit_s + self.capture_s


def marker_key() -> str:
    """What the marker vouches for: the kernels of this engine's SGLang stack."""
    return f"pd-sim-worker {__version__}; sglang 0.5.23; flashinfer 0.7.2; tilelang 0.1.12; sm_120"


def is_warm(location: CacheLocation) -> bool:
    try:
        return json.loads((location.path / WARM_MARKER).read_text()).get("kernels") == marker_key()
    except (OSError, ValueError, AttributeError):
        return False


def mark_warm(locations: list[CacheLocation]) -> None:
    """After a start, the JIT caches hold this stack's kernels (as a real first start leaves them)."""
    for loc in locations:
        (loc.path / WARM_MARKER).write_text(json.dumps({"kernels": marker_key()}) + "\n")


def jit_caches(env: Mapping[str, str] | None = None) -> list[CacheLocation]:
    return [
        loc for loc in cache_locations(env) if loc.jit and loc.key in ("triton", "flashinfer", "tilelang")
    ]


def plan(
    args: argparse.Namespace, role: str, gpu_mem_mib: float | None, env: Mapping[str, str] | None = None
) -> StartupPlan:
    """The start-up this worker spends, from its flags, its knobs, its model directory and its caches."""
    tp = max(1, int(args.tp_size))
    weight = int(args.sim_weight_bytes) if args.sim_weight_bytes >= 0 else checkpoint_bytes(args.model_path)
    rate = float(args.sim_weight_read_gbps)
    load_s = (weight / tp) / (rate * 1e9) if rate > 0 else 0.0
    cold = [loc for loc in jit_caches(env) if not is_warm(loc)]
    bs = capture_batch_sizes(role, args, gpu_mem_mib)
    return StartupPlan(
        weight_bytes=weight,
        tp_size=tp,
        load_s=load_s,
        cold_caches=cold,
        jit_s=len(cold) * max(0.0, float(args.sim_jit_compile_s)),
        capture_bs=bs,
        capture_s=len(bs) * max(0.0, float(args.sim_graph_capture_ms_per_bs)) / 1000.0,
    )


def gpu_memory_mib(gpus: list[int], env: Mapping[str, str] | None = None) -> float | None:
    """Total memory of this worker's first GPU as NVML (the simulated GPUs) reports it; PD_SIM_GPU_MEMORY_MIB
    replaces it (a smaller simulated GPU)."""
    env = os.environ if env is None else env
    override = env.get("PD_SIM_GPU_MEMORY_MIB")
    if override:
        return float(override)
    if not gpus:
        return None
    from pd_standins.gpus import simulated_gpu

    return float(simulated_gpu(gpus[0])["memory_total_mib"])


async def start(args: argparse.Namespace, role: str, env: Mapping[str, str] | None = None) -> StartupPlan:
    """Check and spend the start-up in SGLang's order; raises HostContractError or LaunchRefused.

    Order (SGLang 0.5.23): the model's architecture when the config is read (server args), the
    GPUs when each rank sets its device (ModelRunner.__init__), /dev/shm at NCCL's init, the
    weights, then the caches at the first JIT compile and the locked memory when NIXL registers
    the KV pool; graph capture last.
    """
    from pd_standins.engine import host_contract, kv_pool, launch_checks

    env = os.environ if env is None else env
    model_config = launch_checks.check_architecture(args.model_path)
    gpus = launch_checks.check_gpus(int(args.tp_size), int(args.base_gpu_id), int(args.gpu_id_step), env)
    shm = host_contract.check_shm()
    if shm:
        raise host_contract.HostContractError(shm)
    warning = host_contract.raise_nofile()
    if warning:
        log.warning("%s", warning)
    gpu_mem_mib = gpu_memory_mib(gpus, env)
    startup = plan(args, role, gpu_mem_mib, env)
    log.info(
        "simulated start-up: weight load, %.2f GB of checkpoint, this rank's share %.2f GB (TP %d): %.1f s",
        startup.weight_bytes / 1e9,
        startup.weight_bytes / startup.tp_size / 1e9,
        startup.tp_size,
        startup.load_s,
    )
    await asyncio.sleep(startup.load_s)
    try:
        startup.pool = kv_pool.size(args, role, model_config, gpu_mem_mib, startup.weight_bytes)
    except ValueError as exc:  # no memory left for the KV cache: SGLang's ValueError
        raise launch_checks.LaunchRefused(f"ValueError: {exc}") from exc
    if startup.pool is not None:
        log.info(
            "simulated start-up: KV pool %d tokens (%.0f bytes each, %.2f GB), max_running_requests=%d",
            startup.pool.max_total_num_tokens,
            startup.pool.bytes_per_token,
            startup.pool.available_bytes / 1e9,
            startup.pool.max_running_requests,
        )
    failures = host_contract.check_caches(env)
    memlock = host_contract.check_memlock(env, role, args.disaggregation_transfer_backend)
    if memlock:
        failures.append(memlock)
    if failures:
        raise host_contract.HostContractError("\n".join(failures))
    if startup.cold_caches:
        log.info(
            "simulated start-up: JIT compile into cold caches (%s): %.1f s",
            ", ".join(f"{loc.key} {loc.path}" for loc in startup.cold_caches),
            startup.jit_s,
        )
        await asyncio.sleep(startup.jit_s)
        mark_warm(startup.cold_caches)
    if startup.capture_bs:
        log.info(
            "simulated start-up: CUDA-graph capture of decode batch sizes %s: %.1f s",
            startup.capture_bs,
            startup.capture_s,
        )
        await asyncio.sleep(startup.capture_s)
    log.info("simulated start-up spent: %.1f s", startup.total_s)
    return startup
