"""SGLang 0.5.23's start-up log statements, as templates with the wheel's own variable names.

Each entry: the file in the wheel (under sglang/), fragments that appear verbatim in that file's source
(tests/sglang/test_startup_log_formats.py checks them against the real wheel, so a rewording upstream
fails there), and the message template the statement produces. The parser's tests build their log lines
from these templates and SGLang's logger format, so they read what SGLang writes.
"""

from __future__ import annotations

from typing import Any

# (key, file, verbatim fragments, template)
STATEMENTS: list[tuple[str, str, list[str], str]] = [
    (
        "dsv4_attention",
        "srt/arg_groups/model_overrides/deepseek_v4.py",
        ['f"Use dsv4 attention backend for {model_arch}, setting page_size to {page_size}."'],
        "Use dsv4 attention backend for {model_arch}, setting page_size to {page_size}.",
    ),
    (
        "moe_override",
        "srt/arg_groups/model_overrides/deepseek_v4.py",
        [
            '"Use flashinfer_trtllm_routed as MoE runner backend for "',
            'f"{model_arch} hybrid FP8+NVFP4 checkpoint."',
        ],
        "Use flashinfer_trtllm_routed as MoE runner backend for {model_arch} hybrid FP8+NVFP4 checkpoint.",
    ),
    (
        "kv_dtype",
        "srt/arg_groups/overrides.py",
        ['f"Setting KV cache dtype to {kv_cache_dtype} for {model_arch}."'],
        "Setting KV cache dtype to {kv_cache_dtype} for {model_arch}.",
    ),
    (
        "hybrid",
        "srt/configs/model_config.py",
        ['"Auto-detected hybrid FP8+NVFP4 checkpoint "', '"(NVFP4 MoE group_size=%d, %d exclude_modules)"'],
        "Auto-detected hybrid FP8+NVFP4 checkpoint (NVFP4 MoE group_size={group_size}, "
        "{excluded} exclude_modules)",
    ),
    (
        "nvfp4",
        "srt/layers/quantization/modelopt_quant.py",
        ['logger.info("Detected nvfp4 checkpoint.")'],
        "Detected nvfp4 checkpoint.",
    ),
    (
        "load_weight",
        "srt/model_executor/model_runner.py",
        [
            'f"Load weight end. "',
            'f"elapsed={self.weight_load_time:.2f} s, "',
            'f"type={type(self.model).__name__}, "',
            "f\"{quant_str + ', ' if quant_str else ''}\"",
            'f"avail mem={after_avail_memory:.2f} GB, "',
            'f"mem usage={self.weight_load_mem_usage:.2f} GB."',
        ],
        "Load weight end. elapsed={elapsed:.2f} s, type={model_class}, {quant_str}, "
        "avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.",
    ),
    (
        "attention_impl",
        "srt/layers/attention/attention_registry.py",
        ['f"Using {type(backend).__name__} for dsv4 attention backend (CUDA)."'],
        "Using {cls} for dsv4 attention backend (CUDA).",
    ),
    (
        "capture_begin",
        "srt/model_executor/model_runner_components/cuda_graph_setup.py",
        [
            'f"Capture {capture_name} {graph_backend[model_runner.device]} begin. "',
            'f"backend={decode_backend}, num_tokens_per_req={num_tokens_per_req}, "',
            'f"avail mem={before_mem:.2f} GB"',
        ],
        "Capture {capture_name} CUDA graph begin. backend={backend}, "
        "num_tokens_per_req={num_tokens_per_req}, avail mem={avail:.2f} GB",
    ),
    (
        "capture_end",
        "srt/model_executor/model_runner_components/cuda_graph_setup.py",
        [
            'f"Capture {capture_name} {graph_backend[model_runner.device]} end. "',
            'f"bs={runner.capture_bs}, "',
            'f"elapsed={capture_time:.2f} s, "',
            'f"mem usage={memory_usage_gb:.2f} GB, avail mem={after_mem:.2f} GB."',
        ],
        "Capture {capture_name} CUDA graph end. bs={bs}, elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB, "
        "avail mem={avail:.2f} GB.",
    ),
    (
        "draft_decode",
        "srt/speculative/eagle_worker_v2.py",
        [
            'f"Capture draft decode CUDA graph begin. backend={decode_backend}, "',
            'f"num_tokens_per_req={self.topk}, bs={capture_bs}, "',
        ],
        "Capture draft decode CUDA graph begin. backend={backend}, num_tokens_per_req={topk}, bs={bs}, "
        "avail mem={avail:.2f} GB",
    ),
    (
        "scheduler",
        "srt/managers/scheduler.py",
        [
            'f"max_total_num_tokens={self.max_total_num_tokens}, "',
            'f"max_running_requests={self.max_running_requests}, "',
            'f"context_len={self.model_config.context_len}, "',
        ],
        "max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, max_prefill_tokens={prefill}, "
        "max_running_requests={mrr}, context_len={ctx}, available_gpu_mem={avail:.2f} GB",
    ),
    (
        "nixl_kv_manager",
        "srt/disaggregation/nixl/conn.py",
        ['logger.info(f"NIXL KVManager initialized with backend: {backend}")'],
        "NIXL KVManager initialized with backend: {backend}",
    ),
    (
        "server_args",
        "srt/entrypoints/engine.py",
        ['logger.info(f"server_args={_server_args_for_logging(server_args)}")'],
        "server_args={record}",
    ),
    (
        "fallback_fp8_moe",
        "srt/layers/quantization/fp8.py",
        ['"Fp8MoEMethod has no %s path; using triton for its fp8 experts."'],
        "Fp8MoEMethod has no {backend} path; using triton for its fp8 experts.",
    ),
    (
        "fallback_trtllm_mxfp4",
        "srt/layers/quantization/mxfp4_flashinfer_trtllm_moe.py",
        ['f"Shuffling FP4 expert weights for TRT-LLM MxFP4 kernel "', 'f"(layer: {self.prefix})...",'],
        "Shuffling FP4 expert weights for TRT-LLM MxFP4 kernel (layer: {prefix})...",
    ),
    (
        "fallback_marlin_mxfp4",
        "srt/layers/quantization/mxfp4_marlin_moe.py",
        ['f"Preparing MXFP4 experts for Marlin backend (layer: {self.prefix})...",'],
        "Preparing MXFP4 experts for Marlin backend (layer: {prefix})...",
    ),
    (
        "fallback_nixl_strided",
        "srt/disaggregation/nixl/conn.py",
        [
            '"Installed NIXL does not support strided descriptors, "',
            '"falling back to per-block descriptors."',
        ],
        "Installed NIXL does not support strided descriptors, falling back to per-block descriptors.",
    ),
]

# configure_logger (srt/utils/common.py) and prepare_server_args (srt/server_args.py): the fragments the
# line format is built from.
LOGGER_FORMAT = [
    ("srt/utils/common.py", 'format = f"[%(asctime)s{maybe_ms}{prefix}] %(message)s"'),
    ("srt/utils/common.py", 'datefmt="%Y-%m-%d %H:%M:%S"'),
    ("srt/server_args.py", 'format="[%(asctime)s] %(message)s"'),
    ("srt/managers/scheduler.py", 'prefix += f" TP{shown_tp}"'),
]


def message(key: str, **values: Any) -> str:
    template = next(t for k, _f, _frag, t in STATEMENTS if k == key)
    return template.format(**values)


def line(msg: str, rank: str = "", ts: str = "2026-12-03 10:00:00") -> str:
    """A line as SGLang's logger writes it: `[asctime{prefix}] message` (prefix " TP0" in a scheduler)."""
    return f"[{ts}{rank}] {msg}"
