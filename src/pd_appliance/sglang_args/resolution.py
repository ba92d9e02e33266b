"""What SGLang chose for each layer group, judged for an sm_120 host.

`RealSGLang.resolve` (introspect.resolve_one) returns, per command line, the backends SGLang's
resolution settled on and the quant method class its loader gives each layer group. This module
names the choices the wheel itself marks SM100-only and the fallback kernels (Marlin, torch-native,
the Triton fused-MoE fallback), with the flag that changes each, and renders the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Quant method classes the wheel says run on SM100 only, with where it says so.
SM100_ONLY_METHODS = {
    "Mxfp4FlashinferTrtllmMoEMethod": (
        "sglang/srt/layers/quantization/mxfp4_flashinfer_trtllm_moe.py, "
        "Mxfp4FlashinferTrtllmMoEMethod.__init__: 'this SM100 trtllm path'"
    ),
}
# MoE runner backends the wheel says are SM100-only (trtllm-gen kernels).
SM100_ONLY_MOE_RUNNERS = {
    "flashinfer_trtllm": "sglang/srt/arg_groups/overrides.py: 'trtllm-gen MoE kernels are SM100-only'",
    "flashinfer_trtllm_routed": "sglang/srt/arg_groups/overrides.py: 'trtllm-gen MoE kernels are SM100-only'",
}
# Fallback kernels: slower paths SGLang takes when the fast one is not chosen.
FALLBACK_MOE_RUNNERS = {"marlin", "lora_marlin", "triton", "triton_kernel", "torch_native"}
FALLBACK_MARKERS = ("marlin", "torchnative", "torch_native")

# The flag (and the appliance variable) that changes each kind of choice.
FLAG_MOE = "--moe-runner-backend (serving_moe_runner_backend)"
FLAG_MTP = '--speculative-algorithm (serving_speculative_algorithm: "" turns MTP off)'
FLAG_GEMM = "--fp8-gemm-backend / --fp4-gemm-backend (serving_*_extra_args)"
FLAG_ATTENTION = "--attention-backend (serving_*_extra_args)"


@dataclass(frozen=True)
class Finding:
    """One choice that cannot stand on sm_120."""

    group: str
    choice: str
    why: str
    flag: str

    def __str__(self) -> str:
        return f"{self.group}: {self.choice} ({self.why}); change {self.flag}"


def _is_fallback(name: str | None) -> bool:
    lowered = (name or "").lower().replace("-", "_")
    return any(marker in lowered for marker in FALLBACK_MARKERS)


def _layer_flag(group: str) -> str:
    if group.startswith("MTP"):
        return FLAG_MTP
    return FLAG_MOE if "MoE" in group else FLAG_GEMM


def findings(answer: Mapping[str, Any]) -> list[Finding]:
    """SM100-only choices and fallbacks in one resolution answer (introspect.resolve_one)."""
    if not answer.get("ok"):
        return [Finding("resolution", "refused", str(answer.get("error")), "the command line")]
    out: list[Finding] = []
    resolved, runtime = answer.get("resolved") or {}, answer.get("runtime") or {}
    for key, flag in (("moe_runner_backend", FLAG_MOE), ("speculative_moe_runner_backend", FLAG_MTP)):
        if not resolved.get("speculative_algorithm") and key.startswith("speculative"):
            continue
        backend = str(runtime.get(key) or resolved.get(key))
        group = "MTP MoE runner" if key.startswith("speculative") else "MoE runner"
        if backend in SM100_ONLY_MOE_RUNNERS:
            out.append(Finding(group, backend, "SM100-only: " + SM100_ONLY_MOE_RUNNERS[backend], flag))
        elif backend in FALLBACK_MOE_RUNNERS:
            out.append(Finding(group, backend, "a fallback kernel", flag))
    for key in ("attention_backend", "prefill_attention_backend", "decode_attention_backend"):
        if _is_fallback(resolved.get(key)):
            out.append(Finding(key, str(resolved[key]), "a fallback kernel", FLAG_ATTENTION))
    if _is_fallback(runtime.get("fp4_gemm_runner_backend")):
        out.append(Finding("NVFP4 GEMM", runtime["fp4_gemm_runner_backend"], "a fallback kernel", FLAG_GEMM))
    for layer in answer.get("layers") or []:
        group, method = layer["group"], layer.get("method")
        if layer.get("error"):
            out.append(Finding(group, "refused", layer["error"], _layer_flag(group)))
        elif method in SM100_ONLY_METHODS:
            out.append(
                Finding(group, method, "SM100-only: " + SM100_ONLY_METHODS[method], _layer_flag(group))
            )
        elif _is_fallback(method):
            out.append(Finding(group, str(method), "a fallback kernel", _layer_flag(group)))
    return out


def summary_rows(label: str, answer: Mapping[str, Any]) -> list[str]:
    """Markdown table rows: command line, layer group, what SGLang chose."""
    resolved, runtime = answer.get("resolved") or {}, answer.get("runtime") or {}
    if not answer.get("ok"):
        return [f"| {label} | resolution | refused: {answer.get('error')} |"]
    attention = "/".join(
        str(resolved.get(k) or "-")
        for k in ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
    )
    rows = [
        f"| {label} | attention backend (base/prefill/decode) | {attention} |",
        f"| {label} | MoE runner | {runtime.get('moe_runner_backend')} |",
        f"| {label} | NVFP4 GEMM runner | {runtime.get('fp4_gemm_runner_backend')} |",
        f"| {label} | quant config | {answer.get('quant_config')} |",
    ]
    if resolved.get("speculative_algorithm"):
        rows.append(f"| {label} | MTP MoE runner | {runtime.get('speculative_moe_runner_backend')} |")
    for layer in answer.get("layers") or []:
        method = layer.get("method") or ("unquantized" if not layer.get("error") else layer["error"])
        rows.append(f"| {label} | {layer['group']} (`{layer['prefix']}`) | {method} |")
    return rows


def render_markdown(results: Iterable[tuple[str, Mapping[str, Any]]], platform: Mapping[str, Any]) -> str:
    """The record for the closing note: every command line's choices and findings."""
    lines = [
        "# SGLang's own resolution of every rendered command line",
        "",
        f"Platform as SGLang saw it: {dict(platform)}.",
        "",
        "| command line | layer group | SGLang chose |",
        "| --- | --- | --- |",
    ]
    notes: list[str] = []
    for label, answer in results:
        lines += summary_rows(label, answer)
        notes += [f"- {label}: {f}" for f in findings(answer)]
    lines += ["", "## SM100-only choices and fallbacks", "", *(notes or ["- none"])]
    return "\n".join(lines) + "\n"
