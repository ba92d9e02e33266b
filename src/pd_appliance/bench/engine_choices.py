"""The validation report's view of what each worker's engine chose at start-up.

The serve stage records, per SGLang instance, what the engine said it chose in its start-up log
(pd_appliance.serving.startup_log); the validation stage reads those records from every PD host and
hands them to the report as {host: {instance: record}}. A fallback the engine names in its log fails
validation with that log line, the instance and the flag to change: a deployment that quietly runs
Marlin, Triton fused MoE or an SM100-only kernel on sm_120 is not the one the thresholds were set for.
A missing record is listed, not gated (a host whose programs were not served by this appliance
version has none).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pd_appliance.bench.gates import Gate

EngineStartup = Mapping[str, Mapping[str, Mapping[str, Any]]]


def _instances(startup: EngineStartup | None) -> list[tuple[str, str, Mapping[str, Any]]]:
    return [
        (host, name, record or {})
        for host, programs in sorted((startup or {}).items())
        for name, record in sorted((programs or {}).items())
    ]


def gates(startup: EngineStartup | None) -> list[Gate]:
    """One failed gate per fallback named in a worker's start-up log; one passed gate per clean worker."""
    out: list[Gate] = []
    for host, name, record in _instances(startup):
        if record.get("error"):
            continue
        fallbacks = record.get("fallbacks") or []
        for fallback in fallbacks:
            repeats = f" ({fallback['count']} times)" if int(fallback.get("count") or 1) > 1 else ""
            out.append(
                Gate(
                    f"engine fallback {host}/{name}",
                    False,
                    f"pd:{name} on {host} named a fallback in its start-up log "
                    f"({fallback['name']}){repeats}: "
                    f"`{fallback['line']}`; change {fallback['flag']} (source: {fallback['source']})",
                )
            )
        if not fallbacks:
            out.append(
                Gate(
                    f"engine start-up {host}/{name}",
                    True,
                    f"pd:{name} on {host}: no fallback in its start-up log",
                )
            )
    return out


def _cell(value: Any) -> str:
    if value is None or value == {} or value == []:
        return "-"
    if isinstance(value, list) and all(isinstance(v, int) for v in value) and len(value) > 6:
        return f"{len(value)} sizes: {value[0]}..{value[-1]}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True).replace("|", "/")
    return str(value).replace("|", "/")


def _speculative(choices: Mapping[str, Any]) -> str:
    spec = choices.get("speculative")
    if not spec:
        return "off"
    return (
        f"{spec.get('algorithm')} steps={spec.get('num_steps')} topk={spec.get('eagle_topk')} "
        f"draft={spec.get('num_draft_tokens')}"
    )


def _transfer(record: Mapping[str, Any]) -> str:
    choices = record.get("choices") or {}
    env = record.get("env") or {}
    parts = [
        choices.get("transfer_backend"),
        f"NIXL {choices['nixl_backend']}" if choices.get("nixl_backend") else None,
        f"UCX_TLS={env['UCX_TLS']}" if env.get("UCX_TLS") else None,
        f"UCX_NET_DEVICES={env['UCX_NET_DEVICES']}" if env.get("UCX_NET_DEVICES") else None,
        f"devices {choices['ucx_device_list']}" if choices.get("ucx_device_list") else None,
    ]
    return ", ".join(p for p in parts if p) or "-"


def markdown(startup: EngineStartup | None) -> list[str]:
    """A section: one row per instance with what its engine chose, then each fallback line."""
    rows = _instances(startup)
    if not rows:
        return []
    lines = [
        "",
        "## What each worker's engine chose (from its start-up log)",
        "",
        "| instance | attention | MoE runner | quantization | KV dtype | CUDA-graph bs | speculative "
        "| max running | KV transfer | fallbacks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for host, name, record in rows:
        if record.get("error"):
            lines.append(f"| {host}/{name} | {_cell(record['error'])} |" + " - |" * 8 + " not recorded |")
            continue
        choices = record.get("choices") or {}
        attention = (
            " / ".join(str(v) for v in (choices.get("attention_backend"), choices.get("attention_impl")) if v)
            or "-"
        )
        sm120 = (record.get("env") or {}).get("SGLANG_SM120_FLASHMLA_BACKEND")
        if sm120:
            attention += f" (sm_120 decode: {sm120})"
        quant = choices.get("quant") or choices.get("quantization")
        nvfp4 = choices.get("nvfp4_moe")
        if nvfp4:
            detail = "detected" if nvfp4 is True else _cell(nvfp4)
            quant = f"{quant or '-'}; NVFP4 {detail}"
        graphs = choices.get("cuda_graph_bs")
        graph_cell = (
            f"{choices.get('cuda_graph_capture', '')}: {_cell(graphs)}" if graphs else "none captured"
        )
        fallbacks = record.get("fallbacks") or []
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{host}/{name}",
                    attention,
                    _cell(choices.get("moe_runner_backend")),
                    _cell(quant),
                    _cell(choices.get("kv_cache_dtype")),
                    graph_cell,
                    _speculative(choices),
                    _cell(choices.get("max_running_requests")),
                    _transfer(record),
                    "**" + "; ".join(f["name"] for f in fallbacks) + "**" if fallbacks else "none",
                ]
            )
            + " |"
        )
    named = [(host, name, f) for host, name, record in rows for f in record.get("fallbacks") or []]
    if named:
        lines += ["", "Fallbacks named in the start-up logs:", ""]
        lines += [f"- {host}/{name}: `{f['line']}` — change {f['flag']}" for host, name, f in named]
    return lines
