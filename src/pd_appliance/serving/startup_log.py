"""What SGLang 0.5.23 chose at start-up, read from the worker's own log.

    python -m pd_appliance.serving.startup_log parse LOG [--since "YYYY-mm-dd HH:MM:SS"]
    python -m pd_appliance.serving.startup_log read DIR NAME...

The command line says what was asked for; the engine resolves the rest from the model and the GPU
(attention backend, MoE runner, KV dtype, CUDA-graph batch sizes, speculative settings) and may quietly
take a slower path (Marlin, Triton fused MoE, an SM100-only kernel on sm_120). This module reads the
start-up log for what the engine says it did, in the engine's own words: every pattern below is a
format string of the pinned wheel, cited by its file (paths under sglang/ of sglang 0.5.23), so a
wording change in a new SGLang shows up as a missing choice, not as a wrong one.

Log format (srt/utils/common.py `configure_logger`, srt/server_args.py `prepare_server_args`):
`[%(asctime)s{.%(msecs)03d with SGLANG_LOG_MS}{prefix}] %(message)s`, datefmt `%Y-%m-%d %H:%M:%S`; the
launcher process has no prefix, scheduler processes have " TP0" (and " DP0", " PP0", " EP0"... when those
widths exceed one: srt/managers/scheduler.py `configure_scheduler_process`). NIXL logs through its own
handler (nixl_cu13/logging.py LOGGING_CONFIG): `%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d
%(message)s`.

A supervisor log is appended across restarts: `since` (the program's start, as the log's local time)
keeps only the latest start's lines.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_appliance.files import write_atomic

SGLANG_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{3})?(?P<ranks>(?: [A-Z_]+\d+)*)\] (?P<msg>.*)$"
)
NIXL_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) NIXL (?P<level>[A-Z]+)\s+\S+:\d+ (?P<msg>.*)$"
)
TIMESTAMP = "%Y-%m-%d %H:%M:%S"
# A repr'd scalar, or a dict nested once (cuda_graph_config's phases), for the fallback key-by-key read.
SCALAR_OR_DICT = r"'[^']*'|None|True|False|-?\d+(?:\.\d+)?|\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}"

# The environment the engine process runs with, where it decides something SGLang does not log:
# UCX's transports (UCX reads them; SGLang never prints them), NIXL's backend plugin
# (srt/environ.py SGLANG_DISAGGREGATION_NIXL_BACKEND) and the sm_120 decode kernel
# (srt/environ.py SGLANG_SM120_FLASHMLA_BACKEND, read once at import, not logged).
ENGINE_ENV = (
    "UCX_TLS",
    "UCX_NET_DEVICES",
    "SGLANG_DISAGGREGATION_NIXL_BACKEND",
    "SGLANG_SM120_FLASHMLA_BACKEND",
    "CUDA_VISIBLE_DEVICES",
)

# server_args={...} (srt/entrypoints/engine.py `_launch_subprocesses`: logger.info(f"server_args=
# {_server_args_for_logging(server_args)}"), the resolved record as a dict): the keys read here. Only
# these: the record also holds --api-key, which must never reach a report.
SERVER_ARGS_KEYS = (
    "model_path",
    "tp_size",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "dsv4_attn_backend",
    "moe_runner_backend",
    "speculative_moe_runner_backend",
    "quantization",
    "kv_cache_dtype",
    "page_size",
    "max_running_requests",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)

# Resolved values that are themselves the slow path, named in server_args: (key, values, what, flag).
SLOW_VALUES = (
    ("moe_runner_backend", ("marlin", "experimental_sgl_marlin", "triton", "triton_kernel"),
     "MoE runner resolved to a fallback kernel", "--moe-runner-backend (serving_moe_runner_backend)"),
    ("attention_backend", ("torch_native",), "torch-native attention",
     "--attention-backend (serving_*_extra_args)"),
    ("decode_attention_backend", ("torch_native",), "torch-native decode attention",
     "--decode-attention-backend (serving_decode_extra_args)"),
    ("prefill_attention_backend", ("torch_native",), "torch-native prefill attention",
     "--prefill-attention-backend (serving_prefill_extra_args)"),
)  # fmt: skip


@dataclass(frozen=True)
class Fallback:
    """A slower or unsupported path the engine names in its log."""

    name: str
    pattern: re.Pattern[str]
    flag: str
    source: str


MTP_OFF = "serving_speculative_algorithm: '' (MTP off)"
FALLBACKS = (
    Fallback(
        "SM100-only TRT-LLM MXFP4 MoE (the MTP draft's experts)",
        re.compile(r"Shuffling FP4 expert weights for TRT-LLM MxFP4 kernel \(layer: (?P<layer>[^)]*)\)"),
        f"{MTP_OFF}, or --speculative-moe-runner-backend",
        # HybridFp8NvFp4Config.get_quant_method (modelopt_quant.py) sends MoE layers excluded from NVFP4
        # (the MTP layers) here; the path is SGLang's SM100 trtllm one.
        "srt/layers/quantization/mxfp4_flashinfer_trtllm_moe.py Mxfp4FlashinferTrtllmMoEMethod",
    ),
    Fallback(
        "Triton fused-MoE fallback for fp8 experts",
        re.compile(r"Fp8MoEMethod has no (?P<backend>\w+) path; using triton for its fp8 experts\."),
        f"--moe-runner-backend (serving_moe_runner_backend) / --speculative-moe-runner-backend, or {MTP_OFF}",
        "srt/layers/quantization/fp8.py Fp8MoEMethod.create_moe_runner",
    ),
    Fallback(
        "Triton fused MoE without a tuned config",
        re.compile(r"Using default MoE kernel config\. Performance might be sub-optimal!"),
        "--moe-runner-backend (serving_moe_runner_backend)",
        "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py get_moe_configs",
    ),
    Fallback(
        "Marlin MXFP4 MoE",
        re.compile(r"Preparing MXFP4 experts for Marlin backend"),
        "--moe-runner-backend (serving_moe_runner_backend)",
        "srt/layers/quantization/mxfp4_marlin_moe.py",
    ),
    Fallback(
        "Marlin weight-only FP8",
        re.compile(r"Weight-only FP8 compression will be used leveraging the Marlin kernel"),
        "--fp8-gemm-backend (serving_*_extra_args); the GPU lacks native FP8 as SGLang sees it",
        "srt/layers/quantization/marlin_utils_fp8.py",
    ),
    Fallback(
        "Triton block-FP8 GEMM",
        re.compile(r"block FP8 weights on this setup; using Triton"),
        "--fp8-gemm-backend (serving_*_extra_args)",
        "srt/layers/quantization/fp8_utils.py",
    ),
    Fallback(
        "Triton block-FP8 layer",
        re.compile(r"Block-fp8 layer stays on the Triton kernel"),
        "--fp8-gemm-backend (serving_*_extra_args)",
        "srt/layers/quantization/fp8.py Fp8LinearMethod._prepare_block_fp8_as_mxfp8",
    ),
    # The wheel's own wording for any other fallback: "falling back to ...", "Fallback to ...",
    # "fall back to ..." (e.g. srt/disaggregation/nixl/conn.py, srt/layers/attention/dsv4/unified_kv_gate.py).
    Fallback(
        "fallback named in the log",
        re.compile(r"\b(?:[Ff]alling back|[Ff]all back to|[Ff]allback to)\b"),
        "the setting the line names",
        "sglang (several modules)",
    ),
)

# (key, pattern, source): one choice per match; the named groups are the values.
CHOICES = (
    ("attention_backend",
     re.compile(r"^Use (?P<attention_backend>\S+) attention backend for (?P<model_arch>\S+), "
                r"setting page_size to (?P<page_size>\d+)\.$"),
     "srt/arg_groups/model_overrides/deepseek_v4.py _deepseek_v4_overrides"),
    ("attention_impl",
     re.compile(r"^Using (?P<attention_impl>\w+) for dsv4 attention backend \(CUDA\)\.$"),
     "srt/layers/attention/attention_registry.py create_dsv4_backend"),
    ("attention_hybrid",
     re.compile(r"^Using hybrid attention backend for decode and prefill: "
                r"decode_backend=(?P<decode_attention_backend>[^,]+), "
                r"prefill_backend=(?P<prefill_attention_backend>[^.]+)\.$"),
     "srt/model_executor/model_runner_components/attention_backend_setup.py"),
    ("moe_runner_backend",
     re.compile(r"^Use (?P<moe_runner_backend>\S+) as MoE runner backend for (?P<model_arch>\S+?)"
                r"(?: hybrid FP8\+NVFP4 checkpoint)?\.$"),
     "srt/arg_groups/model_overrides/deepseek_v4.py _deepseek_v4_overrides"),
    ("kv_cache_dtype",
     re.compile(r"^Setting KV cache dtype to (?P<kv_cache_dtype>\S+) for (?P<model_arch>\S+)\.$"),
     "srt/arg_groups/overrides.py _deepseek_v4_kv_cache_dtype"),
    ("hybrid_nvfp4_moe",
     re.compile(r"^Auto-detected hybrid FP8\+NVFP4 checkpoint "
                r"\(NVFP4 MoE group_size=(?P<nvfp4_group_size>\d+), "
                r"(?P<nvfp4_exclude_modules>\d+) exclude_modules\)$"),
     "srt/configs/model_config.py ModelConfig.__init__"),
    ("nvfp4_checkpoint",
     re.compile(r"^(?P<nvfp4_checkpoint>Detected nvfp4 checkpoint)\.$"),
     "srt/layers/quantization/modelopt_quant.py ModelOptFp4Config.__init__"),
    ("load_weight",
     re.compile(r"^Load weight end\. elapsed=[\d.]+ s, type=(?P<model_class>\w+), (?:(?P<quant>quant=.*?), )?"
                r"avail mem=[\d.]+ GB, mem usage=[\d.]+ GB\.$"),
     "srt/model_executor/model_runner.py ModelRunner.load_model"),
    ("max_running_requests",
     re.compile(r"^max_total_num_tokens=(?P<max_total_num_tokens>\d+), chunked_prefill_size=\S+, "
                r"max_prefill_tokens=\S+, max_running_requests=(?P<max_running_requests>\d+), "
                r"context_len=(?P<context_len>\d+), "),
     "srt/managers/scheduler.py Scheduler (startup summary)"),
    ("cuda_graph",
     re.compile(r"^Capture (?P<cuda_graph_role>target) (?P<cuda_graph_kind>decode|verify) "
                r"(?:CUDA|CPU|\w+) graph end\. bs=(?P<cuda_graph_bs>\[[\d, ]*\]), elapsed="),
     "srt/model_executor/model_runner_components/cuda_graph_setup.py"),
    ("cuda_graph_begin",
     re.compile(r"^Capture (?P<cuda_graph_role>target) (?P<cuda_graph_kind>decode|verify) "
                r"(?:CUDA|CPU|\w+) graph begin\. backend=(?P<cuda_graph_backend>\S+), "
                r"num_tokens_per_req=(?P<num_tokens_per_req>\d+), "),
     "srt/model_executor/model_runner_components/cuda_graph_setup.py"),
    ("draft_cuda_graph",
     re.compile(r"^Capture draft (?P<draft_graph>decode|extend) CUDA graph begin\. backend=\S+, "
                r"num_tokens_per_req=(?P<draft_tokens_per_req>\d+), bs=(?P<draft_bs>\[[\d, ]*\]), "),
     "srt/speculative/eagle_worker_v2.py"),
    ("nixl_kv_manager",
     re.compile(r"^NIXL KVManager initialized with backend: (?P<nixl_backend>\S+)$"),
     "srt/disaggregation/nixl/conn.py NixlKVManager.__init__"),
    ("nixl_ucx_devices",
     re.compile(r"^NIXL UCX device binding: gpu_id=(?P<gpu_id>\S+), engine_rank=\S+, "
                r"device_list=(?P<ucx_device_list>.*)$"),
     "srt/disaggregation/nixl/conn.py NixlKVManager.__init__"),
    ("nixl_plugin",
     re.compile(r"^Backend (?P<nixl_plugin>\S+) was instantiated$"),
     "nixl_cu13/_api.py nixl_agent.create_backend"),
)  # fmt: skip


@dataclass(frozen=True)
class LogLine:
    """One engine log line: its timestamp, rank prefix (" TP0"), message and the raw text."""

    ts: str
    ranks: str
    msg: str
    text: str
    source: str  # "sglang" or "nixl"


def parse_line(text: str) -> LogLine | None:
    """An SGLang or NIXL log line, or None for anything else (launcher output, tracebacks, warnings)."""
    text = text.rstrip("\r\n")
    match = SGLANG_LINE.match(text)
    if match:
        return LogLine(match["ts"], match["ranks"].strip(), match["msg"], text, "sglang")
    match = NIXL_LINE.match(text)
    if match:
        return LogLine(match["ts"], "", match["msg"], text, "nixl")
    return None


def log_lines(lines: Iterable[str], since: str | None = None) -> list[LogLine]:
    """The engine's lines from the first one stamped at or after `since` (None: all of them)."""
    out: list[LogLine] = []
    started = since is None
    for raw in lines:
        line = parse_line(raw)
        if line is None:
            continue
        if not started and since is not None and line.ts >= since:  # the format sorts as text
            started = True
        if started:
            out.append(line)
    return out


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def parse_server_args(msg: str) -> dict[str, Any]:
    """The keys of SERVER_ARGS_KEYS (and the decode CUDA-graph config) from a `server_args={...}` line."""
    body = msg.removeprefix("server_args=")
    record = _literal(body)
    if not isinstance(record, dict):
        # A value without a literal repr: take the scalar keys one by one.
        record = {}
        for key in (*SERVER_ARGS_KEYS, "cuda_graph_config"):
            match = re.search(rf"'{key}': ({SCALAR_OR_DICT})", body)
            if match:
                record[key] = _literal(match.group(1))
    out = {key: record[key] for key in SERVER_ARGS_KEYS if key in record}
    graphs = record.get("cuda_graph_config")
    if isinstance(graphs, dict) and isinstance(graphs.get("decode"), dict):
        decode = graphs["decode"]
        out["cuda_graph_decode"] = {k: decode.get(k) for k in ("backend", "max_bs", "bs")}
    return out


def _speculative(server_args: Mapping[str, Any]) -> dict[str, Any] | None:
    if not server_args.get("speculative_algorithm"):
        return None
    return {
        "algorithm": server_args["speculative_algorithm"],
        "num_steps": server_args.get("speculative_num_steps"),
        "eagle_topk": server_args.get("speculative_eagle_topk"),
        "num_draft_tokens": server_args.get("speculative_num_draft_tokens"),
    }


def _apply_choice(found: dict[str, Any], groups: Mapping[str, str | None]) -> None:
    """Store a matched line's named groups (first occurrence wins: rank 0, the first start)."""
    for name, value in groups.items():
        if value is None or name in ("draft_graph", "draft_tokens_per_req"):
            continue
        parsed: Any = value
        if name in ("cuda_graph_bs", "draft_bs"):
            parsed = _literal(value)
        elif value.isdigit():
            parsed = int(value)
        elif name == "nvfp4_checkpoint":
            parsed = True
        if name == "draft_bs":
            found.setdefault("draft_cuda_graph_bs", {}).setdefault(groups["draft_graph"], parsed)
        else:
            found.setdefault(name, parsed)


def extract(lines: Sequence[LogLine]) -> dict[str, Any]:
    """What the engine chose and the fallbacks it named, from its start-up lines.

    Returns {"choices": {...}, "evidence": {choice: the log line}, "fallbacks": [{name, line, flag,
    source, count}], "engine_lines": how many SGLang/NIXL lines were read}. server_args gives the
    resolved configuration; the runtime lines (graph capture, NIXL, attention class) say what ran and win
    where both speak.
    """
    runtime: dict[str, Any] = {}
    evidence: dict[str, str] = {}
    server_args: dict[str, Any] = {}
    fallbacks: dict[tuple[str, str], dict[str, Any]] = {}
    for line in lines:
        if line.msg.startswith("server_args=") and not server_args:
            server_args = parse_server_args(line.msg)
            evidence["server_args"] = "server_args={...}"  # the record holds --api-key: never copied
            continue
        for key, pattern, _source in CHOICES:
            match = pattern.search(line.msg)
            if match:
                _apply_choice(runtime, match.groupdict())
                evidence.setdefault(key, line.text)
        for fallback in FALLBACKS:
            if fallback.pattern.search(line.msg):
                seen = fallbacks.setdefault(
                    (fallback.name, line.msg),
                    {"name": fallback.name, "line": line.text, "flag": fallback.flag,
                     "source": fallback.source, "count": 0},
                )  # fmt: skip
                seen["count"] += 1
                break
    for key, values, what, flag in SLOW_VALUES:
        if server_args.get(key) in values:
            text = f"server_args: {key}={server_args[key]!r}"
            source = "srt/entrypoints/engine.py (resolved server_args)"
            fallbacks[(what, text)] = {"name": what, "line": text, "flag": flag, "count": 1, "source": source}
    choices = _choices(server_args, runtime)
    return {
        "choices": choices,
        "evidence": evidence,
        "fallbacks": list(fallbacks.values()),
        "engine_lines": len(lines),
    }


def _choices(server_args: Mapping[str, Any], runtime: Mapping[str, Any]) -> dict[str, Any]:
    """One flat record: the runtime lines where they speak, else the resolved server_args."""
    decode_graph = server_args.get("cuda_graph_decode") or {}
    speculative = _speculative(server_args)
    if (
        speculative is not None
        and "num_tokens_per_req" in runtime
        and runtime.get("cuda_graph_kind") == "verify"
    ):
        speculative["verify_tokens_per_req"] = runtime["num_tokens_per_req"]
    choices: dict[str, Any] = {
        "model_class": runtime.get("model_class"),
        "attention_backend": runtime.get("attention_backend") or server_args.get("attention_backend"),
        "attention_impl": runtime.get("attention_impl"),
        "decode_attention_backend": runtime.get("decode_attention_backend")
        or server_args.get("decode_attention_backend"),
        "prefill_attention_backend": runtime.get("prefill_attention_backend")
        or server_args.get("prefill_attention_backend"),
        "page_size": runtime.get("page_size") or server_args.get("page_size"),
        "moe_runner_backend": server_args.get("moe_runner_backend") or runtime.get("moe_runner_backend"),
        "quantization": server_args.get("quantization"),
        "quant": runtime.get("quant"),
        "nvfp4_moe": (
            {"group_size": runtime["nvfp4_group_size"], "exclude_modules": runtime["nvfp4_exclude_modules"]}
            if "nvfp4_group_size" in runtime
            else (True if runtime.get("nvfp4_checkpoint") else None)
        ),
        "kv_cache_dtype": server_args.get("kv_cache_dtype") or runtime.get("kv_cache_dtype"),
        "cuda_graph_bs": runtime.get("cuda_graph_bs"),
        "cuda_graph_capture": (
            f"{runtime['cuda_graph_role']} {runtime['cuda_graph_kind']}"
            if "cuda_graph_role" in runtime
            else None
        ),
        "cuda_graph_decode_config": decode_graph or None,
        "draft_cuda_graph_bs": runtime.get("draft_cuda_graph_bs"),
        "speculative": speculative,
        "max_running_requests": runtime.get("max_running_requests")
        or server_args.get("max_running_requests"),
        "disaggregation_mode": server_args.get("disaggregation_mode"),
        "transfer_backend": server_args.get("disaggregation_transfer_backend"),
        "nixl_backend": runtime.get("nixl_backend"),
        "nixl_plugin": runtime.get("nixl_plugin"),
        "ucx_device_list": runtime.get("ucx_device_list"),
    }
    return {key: value for key, value in choices.items() if value is not None}


def parse_log(path: str | os.PathLike[str], since: str | None = None) -> dict[str, Any]:
    """extract() over a log file's lines from `since` on; a file that cannot be read says so."""
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            lines = log_lines(handle, since)
    except OSError as exc:
        return {"choices": {}, "evidence": {}, "fallbacks": [], "engine_lines": 0,
                "error": f"cannot read {path}: {exc.strerror}"}  # fmt: skip
    return extract(lines)


def local_timestamp(epoch: float) -> str:
    """An epoch as the log's timestamp (the engine logs local time, to the second)."""
    return time.strftime(TIMESTAMP, time.localtime(epoch))


def process_env(pid: int, names: Sequence[str] = ENGINE_ENV) -> dict[str, str] | None:
    """The named variables of a running process's environment (/proc/PID/environ), None if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
    return {name: env[name] for name in names if name in env}


def record_program(info: Mapping[str, Any], program: str, log: str, out: str | None = None) -> dict[str, Any]:
    """Parse a healthy program's log since its start (supervisor's getProcessInfo `info`) and, with
    `out`, write the record there as JSON: what the serve stage keeps for the validation report."""
    start = info.get("start") or 0
    since = local_timestamp(max(float(start) - 1, 0)) if start else None
    record = {"program": program, "log": log, "since": since, **parse_log(log, since)}
    pid = int(info.get("pid") or 0)
    env = process_env(pid) if pid else None
    if env is not None:
        record["env"] = env
    record["recorded_at"] = local_timestamp(time.time())
    if out:
        write_atomic(Path(out), json.dumps(record, indent=2, sort_keys=True) + "\n", mode=0o600)
    return record


def read_records(directory: str | os.PathLike[str], names: Sequence[str]) -> dict[str, Any]:
    """Each named program's record from `directory` (<name>.json); a missing one says why."""
    out: dict[str, Any] = {}
    for name in names:
        path = Path(directory) / f"{name}.json"
        try:
            out[name] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            out[name] = {"error": f"no start-up record at {path} ({exc}): the serve stage writes it when "
                         f"pd:{name} is healthy"}  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.serving.startup_log", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    parse = sub.add_parser("parse", help="parse a worker log; print the record")
    parse.add_argument("log")
    parse.add_argument("--since", help="first timestamp to read (the log's local time)")
    read = sub.add_parser("read", help="print the records the serve stage wrote, by program name")
    read.add_argument("directory")
    read.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "parse":
        print(json.dumps(parse_log(args.log, args.since), indent=2, sort_keys=True))
    else:
        print(json.dumps(read_records(args.directory, args.names), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
