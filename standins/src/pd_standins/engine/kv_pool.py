"""The rehearsal engine's KV pool, sized as SGLang 0.5.23 sizes DeepSeek-V4's, and what it admits.

Sizing (pd_appliance.model.kv_pool: DSV4PoolConfigurator's bytes per token, KVCacheConfigurator's
budget and resolve_max_num_reqs): one rank's pool is the simulated GPU's memory x
--mem-fraction-static, less this rank's share of the weights, over the KV bytes a token costs
(from the checkpoint's config.json); max_total_num_tokens is that, page-aligned (DeepSeek-V4's
page is 256: arg_groups/model_overrides/deepseek_v4.py), capped by --max-total-tokens
(kv_cache_configurator._apply_token_constraints); max_running_requests is
min(--max-running-requests or the estimate clamped to [2048, 4096], tokens // 2).

The GPU's memory is the simulated GPU's (pd_standins.gpus, what NVML reports on the rehearsal's
GPUs: 97,887 MiB), or PD_SIM_GPU_MEMORY_MIB. --mem-fraction-static unset is derived as
srt/arg_groups/memory_hook.py does (the reserve for activations, at least 10 GiB on a GPU above
60 GiB; its CUDA-graph reserve is left out).

Admission (what makes a small pool cap the running requests on its own, as in sglang PR 33075's
"KV pool capped running requests at 6"): a decode admits a request once the pool has
ceil_align(prompt, page) + num_reserved_decode_tokens (512) free tokens
(srt/disaggregation/decode.py _prealloc_required_tokens; arg_groups/fields/disagg.py), and holds
them until the request finishes; a prompt larger than the whole pool is refused with SGLang's 400
("Request ... exceeds the maximum number of tokens", _check_if_req_exceed_kv_capacity). A prefill
holds its prompt's pages while it prefills. A local --model-path without DeepSeek-V4's KV fields in
config.json, or a Hub id, leaves the pool unsized (256 running requests, the simulator's default).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from pd_appliance.model import KVPool, ModelConfigError, kv_pool, weight_bytes_per_rank
from pd_appliance.model.deepseek_v4 import PAGE_SIZE, DeepSeekV4Shape

log = logging.getLogger("pd_sim_worker")

MIB = 1 << 20
NUM_RESERVED_DECODE_TOKENS = 512
UNSIZED_MAX_RUNNING_REQUESTS = 256


def default_mem_fraction_static(gpu_mem_mib: float, role: str, args: Any) -> float:
    """memory_hook._handle_gpu_memory_settings for --mem-fraction-static unset (graph reserve left out)."""
    from pd_standins.engine.startup import default_chunked_prefill_size, default_decode_max_bs

    tp = int(args.tp_size)
    if role == "decode":
        graph_bs = args.cuda_graph_max_bs_decode or default_decode_max_bs(gpu_mem_mib, tp)
        running = args.max_running_requests or graph_bs
        activation_tokens = max(int(running), 2048)
    else:
        activation_tokens = max(args.chunked_prefill_size or default_chunked_prefill_size(gpu_mem_mib), 2048)
    reserved = 512 + activation_tokens * 1.5 + tp / 8 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def size(
    args: Any, role: str, config: dict[str, Any] | None, gpu_mem_mib: float | None, checkpoint_bytes: int
) -> KVPool | None:
    """This rank's KV pool, or None when the model gives no DeepSeek-V4 shape to size it from."""
    if config is None or gpu_mem_mib is None:
        return None
    try:
        shape = DeepSeekV4Shape.from_config(config)
    except ModelConfigError as exc:
        log.warning("KV pool not sized (%s): at most %d running requests", exc, UNSIZED_MAX_RUNNING_REQUESTS)
        return None
    fraction = args.mem_fraction_static or default_mem_fraction_static(gpu_mem_mib, role, args)
    common = {
        "gpu_memory_bytes": int(gpu_mem_mib * MIB),
        "mem_fraction_static": fraction,
        "weight_bytes": weight_bytes_per_rank(checkpoint_bytes, max(1, int(args.tp_size))),
        "context_length": args.context_length,
        "max_running_requests": args.max_running_requests,
        "speculative": bool(args.speculative_algorithm),
    }
    pool = kv_pool(shape, **common)
    if args.max_total_tokens and args.max_total_tokens < pool.max_total_num_tokens:
        tokens = int(args.max_total_tokens) // PAGE_SIZE * PAGE_SIZE
        estimated = max(min(int(tokens / pool.context_length * 512), 4096), 2048)
        running = min(args.max_running_requests or estimated, tokens // 2)
        pool = KVPool(pool.available_bytes, pool.bytes_per_token, tokens, running, pool.context_length)
    return pool


def request_tokens(role: str, prompt_tokens: int) -> int:
    """Pool tokens a request holds while it runs (decode: _prealloc_required_tokens)."""
    pages = math.ceil(max(1, prompt_tokens) / PAGE_SIZE) * PAGE_SIZE
    return pages if role == "prefill" else pages + NUM_RESERVED_DECODE_TOKENS


class TokenPool:
    """Free KV tokens; a request waits until its tokens are free (FIFO), then holds them."""

    def __init__(self, total: int) -> None:
        self.total = int(total)
        self.free = int(total)
        self._cond = asyncio.Condition()
        self._waiting: list[object] = []

    async def acquire(self, tokens: int) -> None:
        ticket = object()
        async with self._cond:
            self._waiting.append(ticket)
            try:
                await self._cond.wait_for(lambda: self._waiting[0] is ticket and self.free >= tokens)
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()
            self.free -= tokens

    async def release(self, tokens: int) -> None:
        async with self._cond:
            self.free += tokens
            self._cond.notify_all()

    @property
    def usage(self) -> float:
        return 1.0 - self.free / self.total if self.total else 0.0
