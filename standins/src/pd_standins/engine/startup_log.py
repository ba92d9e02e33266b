"""SGLang 0.5.23's own start-up lines, printed by the rehearsal engine for what its flags imply.

The serve stage reads a worker's start-up log for what the engine chose (pd_appliance.serving.startup_log)
and the validation report fails on a fallback named there. So the rehearsal engine prints the lines SGLang
0.5.23 prints, with the wheel's format strings (each cited by its file under sglang/ of the wheel) and in
its logger format, and with values derived from its own command line, environment and checkpoint the way
SGLang derives them. The parser is then tested against the real format, and a flag that makes SGLang take
a fallback makes the rehearsal engine name it too.

Logger format: srt/server_args.py `prepare_server_args` (launcher process: "[%(asctime)s] %(message)s") and
srt/utils/common.py `configure_logger` (scheduler processes: "[%(asctime)s{prefix}] %(message)s", with
".%(msecs)03d" after asctime when SGLANG_LOG_MS is set; prefix " TP<rank>" when tp_size > 1, from
srt/managers/scheduler.py `configure_scheduler_process`), datefmt "%Y-%m-%d %H:%M:%S". NIXL logs through
its own handler (nixl_cu13 1.5.1 logging.py LOGGING_CONFIG).

What SGLang decides from the GPU is taken for the lab's GPU (RTX PRO 6000, sm_120, 96 GB).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from pd_standins.engine.startup import decode_capture_batch_sizes, default_decode_max_bs

DATEFMT = "%Y-%m-%d %H:%M:%S"
DSV4 = "DeepseekV4ForCausalLM"
# NVML's memory.total of an RTX PRO 6000 Blackwell (MiB): the band srt/arg_groups/memory_hook.py
# `handle_gpu_memory_settings` puts it in (90 GiB <= gpu_mem < 160 GiB, "H20, H200").
LAB_GPU_MEMORY_MIB = 97887


class _BooleanOptional(argparse.Action):
    """--x / --no-x (SGLang's BooleanOptionalAction flags, both spellings in the flag table)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


def flag_values(argv: Sequence[str], table: Mapping[str, Any]) -> dict[str, Any]:
    """Every SGLang flag given on the command line, by dest (absent flags are left out).

    pd-sim-worker's own parser (cli.py) validates the command line and keeps only the flags it
    simulates; this reads the values of the rest, with the same option strings and abbreviations.
    """
    parser = argparse.ArgumentParser(
        add_help=False, allow_abbrev=table["allow_abbrev"], prefix_chars=table["prefix_chars"]
    )
    for flag in table["flags"]:
        options, kind = flag["options"], flag["kind"]
        spec: dict[str, Any] = {"dest": flag["dest"], "default": argparse.SUPPRESS}
        if kind == "help":
            continue
        if kind == "flag":
            spec.update(action="store_const", const=True)
        elif kind == "boolean_optional":
            spec.update(action=_BooleanOptional, nargs=0)
        else:
            if flag["nargs"] is not None:
                spec["nargs"] = flag["nargs"]
            if flag["type"] in ("int", "float"):
                spec["type"] = int if flag["type"] == "int" else float
        parser.add_argument(*options, **spec)
    known, _rest = parser.parse_known_args(list(argv))
    return vars(known)


def read_model_config(model_path: str | None) -> dict[str, Any]:
    """The checkpoint's config.json ({} when there is none to read)."""
    if not model_path:
        return {}
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def nvfp4_moe_meta(hf_config: Mapping[str, Any]) -> dict[str, Any] | None:
    """srt/configs/model_config.py ModelConfig.__init__ ("Handle hybrid NVFP4 moe"): quant_algo
    MIXED_PRECISION with moe_quant_algo NVFP4 and a group_size make a hybrid FP8+NVFP4 checkpoint."""
    quant = hf_config.get("quantization_config") or {}
    if (
        str(quant.get("quant_algo", "")).upper() == "MIXED_PRECISION"
        and str(quant.get("moe_quant_algo", "")).upper() == "NVFP4"
        and quant.get("group_size") is not None
    ):
        return {"group_size": int(quant["group_size"]), "exclude_modules": list(quant.get("ignore") or [])}
    return None


def captured_decode_bs(flags: Mapping[str, Any], tp_size: int, max_running_requests: int | None) -> list[int]:
    """The decode batch sizes SGLang captures: the configured list (handle_gpu_memory_settings +
    generate_decode_cuda_graph_batch_sizes; --cuda-graph-bs-decode wins; a default max_bs is capped
    at an explicit --max-running-requests), then srt/model_executor/runner/base_cuda_graph_runner.py
    `get_batch_sizes_to_capture` against the request pool (req_to_token_pool.size): the pool size is
    added when it is below the largest, and larger sizes are dropped. Alignment is 1 without DP
    attention or two-batch overlap. With no --max-running-requests the pool is sized later, far above
    any captured size (pd_appliance.model), so nothing is capped here."""
    if flags.get("cuda_graph_bs_decode"):
        configured = [int(bs) for bs in flags["cuda_graph_bs_decode"]]
    else:
        max_bs = flags.get("cuda_graph_max_bs_decode")
        if max_bs is None:
            max_bs = default_decode_max_bs(LAB_GPU_MEMORY_MIB, tp_size)
            if flags.get("max_running_requests") is not None:
                max_bs = min(max_bs, int(flags["max_running_requests"]))
        configured = decode_capture_batch_sizes(
            int(max_bs),
            bool(flags.get("speculative_algorithm")),
            bool(flags.get("disable_cuda_graph_padding")),
        )
    capture_bs = list(configured)
    if max_running_requests is None:
        return sorted(set(capture_bs))
    if max(capture_bs) > max_running_requests:
        capture_bs.append(max_running_requests)
    return sorted({bs for bs in capture_bs if bs <= max_running_requests})


def _speculative(flags: Mapping[str, Any]) -> dict[str, Any] | None:
    """The speculative settings as srt/arg_groups/speculative_hook.py `_handle_eagle_family` leaves
    them: with topk 1, num_draft_tokens becomes num_steps + 1 (it warns when it changes it)."""
    algorithm = flags.get("speculative_algorithm")
    if not algorithm:
        return None
    steps, topk = flags.get("speculative_num_steps"), flags.get("speculative_eagle_topk")
    draft = flags.get("speculative_num_draft_tokens")
    adjusted = topk == 1 and steps is not None and draft != steps + 1
    return {
        "algorithm": algorithm,
        "num_steps": steps,
        "eagle_topk": topk,
        "num_draft_tokens": steps + 1 if adjusted else draft,
        "adjusted": adjusted,
    }


class Emitter:
    """Formats lines as SGLang's and NIXL's loggers do and writes them to a stream."""

    def __init__(self, stream: IO[str], clock: Callable[[], float] = time.time, log_ms: bool = False):
        self.stream, self.clock, self.log_ms = stream, clock, log_ms
        self.lines: list[str] = []

    def sglang(self, message: str, rank: str = "", level: int = logging.INFO) -> str:
        ms = ".%(msecs)03d" if self.log_ms else ""
        formatter = logging.Formatter(f"[%(asctime)s{ms}{rank}] %(message)s", datefmt=DATEFMT)
        return self._write(formatter, "sglang", level, message, "", 0)

    def nixl(self, message: str, filename: str, lineno: int, level: int = logging.INFO) -> str:
        formatter = logging.Formatter(
            "%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d %(message)s", datefmt=DATEFMT
        )
        return self._write(formatter, "nixl", level, message, filename, lineno)

    def _write(
        self, formatter: logging.Formatter, name: str, level: int, msg: str, path: str, lineno: int
    ) -> str:
        record = logging.LogRecord(name, level, path, lineno, msg, None, None)
        record.created = self.clock()
        record.msecs = (record.created - int(record.created)) * 1000
        text = formatter.format(record)
        self.stream.write(text + "\n")
        self.stream.flush()
        self.lines.append(text)
        return text


def _server_args(flags: Mapping[str, Any], resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved record's keys this simulation decides (srt/entrypoints/engine.py logs the whole
    ServerArgs.resolved_dict(); the stand-in prints a subset). The API keys read "<redacted>", as
    the appliance's patch 0003 makes SGLang's _server_args_for_logging print them."""
    keys = (
        "model_path",
        "served_model_name",
        "tp_size",
        "disaggregation_mode",
        "disaggregation_transfer_backend",
        "mem_fraction_static",
        "context_length",
        "enable_metrics",
    )
    secrets = {key: "<redacted>" if flags.get(key) else None for key in ("api_key", "admin_api_key")}
    return {**{key: flags.get(key) for key in keys}, **secrets, **resolved}


def emit(
    argv: Sequence[str],
    config: Any,
    table: Mapping[str, Any],
    stream: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """Print SGLang 0.5.23's start-up lines for this command line; return them.

    `config` is pd-sim-worker's SimConfig (role, tp_size, max_running_requests, context_length,
    model_path); `table` the SGLang flag table.
    """
    environ = os.environ if environ is None else environ
    out = Emitter(stream or sys.stderr, clock, log_ms=bool(environ.get("SGLANG_LOG_MS")))
    flags = flag_values(argv, table)
    hf_config = read_model_config(config.model_path)
    arch = (hf_config.get("architectures") or [None])[0]
    hybrid = nvfp4_moe_meta(hf_config)
    quant = hf_config.get("quantization_config") or {}
    speculative = _speculative(flags)
    role = config.role
    tp = int(config.tp_size or 1)
    ranks = [f" TP{r}" if tp > 1 else "" for r in range(tp)]

    # Resolution, in the launcher process (srt/arg_groups/...).
    attention = flags.get("attention_backend")
    moe = flags.get("moe_runner_backend") or "auto"
    kv_dtype = flags.get("kv_cache_dtype") or "auto"
    page_size = flags.get("page_size")
    if arch == DSV4:
        attention, page_size = "dsv4", 256
        out.sglang(f"Use dsv4 attention backend for {arch}, setting page_size to {page_size}.")
        if moe == "auto" and hybrid is not None:
            moe = "flashinfer_trtllm_routed"
            out.sglang(
                f"Use flashinfer_trtllm_routed as MoE runner backend for {arch} hybrid FP8+NVFP4 checkpoint."
            )
        if kv_dtype == "auto":  # srt/arg_groups/overrides.py _deepseek_v4_kv_cache_dtype
            kv_dtype = "fp8_e4m3"
            out.sglang(f"Setting KV cache dtype to {kv_dtype} for {arch}.", level=logging.WARNING)
        if role == "prefill":  # srt/arg_groups/cuda_graph_hook.py disable_breakable_cudagraph_if_incompatible
            out.sglang(
                "Breakable CUDA graph is incompatible with DeepSeek-V4 (heavy capture-pool memory pressure); "
                "disabling prefill CUDA graph.",
                level=logging.WARNING,
            )
    if hybrid is not None:
        out.sglang(
            f"Auto-detected hybrid FP8+NVFP4 checkpoint (NVFP4 MoE group_size={hybrid['group_size']:d}, "
            f"{len(hybrid['exclude_modules']):d} exclude_modules)"
        )
    if speculative and speculative["adjusted"]:
        out.sglang(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
            "when speculative_eagle_topk == 1",
            level=logging.WARNING,
        )
    graphs_on = not flags.get("disable_cuda_graph") and role != "prefill"
    decode_bs = captured_decode_bs(flags, tp, config.max_running_requests) if graphs_on else []
    resolved = {
        "attention_backend": attention,
        "moe_runner_backend": moe,
        "kv_cache_dtype": kv_dtype,
        "page_size": page_size,
        "quantization": flags.get("quantization"),
        # The launcher logs the flag as given; the scheduler line below has the derived figure.
        "max_running_requests": flags.get("max_running_requests"),
        "speculative_algorithm": speculative["algorithm"] if speculative else None,
        "speculative_num_steps": speculative["num_steps"] if speculative else None,
        "speculative_eagle_topk": speculative["eagle_topk"] if speculative else None,
        "speculative_num_draft_tokens": speculative["num_draft_tokens"] if speculative else None,
        "cuda_graph_config": {
            "decode": {"backend": "full" if graphs_on else "disabled", "max_bs": max(decode_bs, default=None),
                       "bs": decode_bs or None},
            "prefill": {"backend": "disabled", "max_bs": None, "bs": None},
        },
    }  # fmt: skip
    out.sglang(f"server_args={_server_args(flags, resolved)}")

    # Each scheduler process (one per TP rank).
    quant_str = ", ".join(
        [f"quant={quant.get('quant_method', 'quantized')}"]
        + [f"{k}={quant[k]}" for k in ("bits", "quant_algo", "fmt", "requantization_method") if k in quant]
    )  # srt/configs/model_config.py get_quantization_config_log_str
    nvfp4 = hybrid is not None or str(quant.get("quant_algo", "")).upper() == "NVFP4"
    nixl_backend = environ.get("SGLANG_DISAGGREGATION_NIXL_BACKEND") or "UCX"  # srt/environ.py default
    dsv4_impl = {"trtllm": "DeepseekV4TrtllmAttnBackend", "flashmla_mega": "DeepseekV4MegaAttnBackend"}.get(
        flags.get("dsv4_attn_backend") or "auto", "DeepseekV4AttnBackend"
    )  # srt/layers/attention/deepseek_v4_trtllm_backend.py create_deepseek_v4_attn_backend (auto -> flashmla)
    for number, rank in enumerate(ranks):
        if nvfp4:
            out.sglang("Detected nvfp4 checkpoint.", rank)  # modelopt_quant.py ModelOptFp4Config.__init__
        load_quant = f"{quant_str}, " if quant else ""
        out.sglang(
            f"Load weight end. elapsed=0.00 s, type={arch or 'Simulated'}, {load_quant}"
            f"avail mem=80.00 GB, mem usage=0.00 GB.",
            rank,
        )  # srt/model_executor/model_runner.py ModelRunner.load_model
        if number == 0 and speculative and arch == DSV4 and hybrid is not None:
            # modelopt_quant.py HybridFp8NvFp4Config.get_quant_method: the MTP layer's MoE is excluded
            # from NVFP4 (loader.py adds "model.decoder.*"), so it goes to Mxfp4FlashinferTrtllmMoEMethod,
            # which logs this on rank 0 (mxfp4_flashinfer_trtllm_moe.py, log_info_on_rank0).
            out.sglang(
                "Shuffling FP4 expert weights for TRT-LLM MxFP4 kernel (layer: model.decoder.mlp.experts)...",
                rank,
            )
        if attention == "dsv4":
            out.sglang(f"Using {dsv4_impl} for dsv4 attention backend (CUDA).", rank)
        if role in ("prefill", "decode") and flags.get("disaggregation_transfer_backend") == "nixl":
            # nixl_cu13/_api.py nixl_agent.create_backend, then srt/disaggregation/nixl/conn.py.
            out.nixl(f"Backend {nixl_backend} was instantiated", "_api.py", 405)
            out.sglang(f"NIXL KVManager initialized with backend: {nixl_backend}", rank)
        if decode_bs:
            # srt/model_executor/model_runner_components/cuda_graph_setup.py: "verify" under speculation,
            # num_tokens_per_req = the draft tokens per request.
            kind = "verify" if speculative else "decode"
            per_req = speculative["num_draft_tokens"] if speculative else 1
            out.sglang(
                f"Capture target {kind} CUDA graph begin. backend=full, num_tokens_per_req={per_req}, "
                f"avail mem=20.00 GB",
                rank,
            )
            out.sglang(
                f"Capture target {kind} CUDA graph end. bs={decode_bs}, elapsed=0.00 s, mem usage=0.00 GB, "
                f"avail mem=20.00 GB.",
                rank,
            )
            if speculative and number == 0:  # srt/speculative/eagle_worker_v2.py (log_info_on_rank0)
                if (speculative["num_steps"] or 1) > 1:
                    out.sglang(
                        f"Capture draft decode CUDA graph begin. backend=full, "
                        f"num_tokens_per_req={speculative['eagle_topk']}, bs={decode_bs}, avail mem=20.00 GB",
                        rank,
                    )
                out.sglang(
                    f"Capture draft extend CUDA graph begin. backend=full, "
                    f"num_tokens_per_req={speculative['num_draft_tokens']}, bs={decode_bs}, "
                    "avail mem=20.00 GB",
                    rank,
                )
        if number == 0:  # srt/managers/scheduler.py (tp_rank 0)
            total_tokens = getattr(config, "max_total_num_tokens", None) or config.context_length
            out.sglang(
                f"max_total_num_tokens={total_tokens}, "
                f"chunked_prefill_size={flags.get('chunked_prefill_size') or 8192}, "
                "max_prefill_tokens=16384, "
                f"max_running_requests={config.max_running_requests}, context_len={config.context_length}, "
                f"available_gpu_mem=20.00 GB",
                rank,
            )
    return out.lines
