"""The memory-bound decode limit of a serving layout: how many output tok/s the GPUs' memory
bandwidth allows at most, so a report can say how far a measured figure is from it.

A decode step reads, on every GPU of an instance (tensor parallel over `tp` GPUs):
- its share (1/tp) of the dense weights: attention, shared experts, gates, norms, the LM head
  (every step reads them whole; the embedding is left out: a step reads one row a token);
- its share of the routed experts the batch touches in each MoE layer: with B tokens each routed
  to k of E experts, E * (1 - (1 - k/E)^B) distinct experts if routing were uniform. Real routing
  is skewed and touches fewer, so the limit here is a little low at mid batches, never high at bs=1;
- the whole KV of every sequence in the batch: MLA keeps one latent KV head that every TP rank holds
  whole, so KV is not divided by tp. Counted as all the KV the sequence holds (an upper bound: the
  sparse attention of DeepSeek-V4 reads a top-k subset of the compressed tokens).

A step moves those bytes at the GPU's memory bandwidth at best, and yields one token per sequence
(speculative decoding is not modelled: a speculative figure may exceed the plain limit, and the
report says so). The MTP layers are left out for the same reason. docs/roofline.md has the worked
example for this checkpoint on RTX PRO 6000.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_appliance.bench.gates import concurrency_label
from pd_appliance.checkpoint.safetensors_format import SafetensorsFormatError, read_safetensors_summary
from pd_appliance.model.deepseek_v4 import (
    DeepSeekV4Shape,
    ModelConfigError,
    bytes_per_full_token,
    load_config,
)

# A routed expert's tensor: model.layers.<L>.mlp.experts.<E>.<proj>... (the NVFP4 release's names).
ROUTED_EXPERT = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts\.(\d+)\.")
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
EMBEDDING = re.compile(r"embed_tokens")
MTP = re.compile(r"(?:^|\.)mtp[._]")
# NVFP4: 4 bits a weight plus one FP8 scale per 16 (weight_scale), per-tensor F32 scales aside.
NVFP4_BYTES_PER_PARAM = 0.5 + 1 / 16


class RooflineError(ValueError):
    """The inputs cannot give a limit; the message says which input and how to fix it."""


@dataclass(frozen=True)
class WeightGroups:
    """The checkpoint's bytes as a decode step reads them."""

    dense_bytes: int
    routed_expert_bytes: float
    moe_layers: int
    experts: int
    experts_per_token: int
    source: str

    def routed_bytes_touched(self, batch: int) -> float:
        """Bytes of routed experts a step reads over all MoE layers for `batch` tokens."""
        touched = experts_touched(self.experts, self.experts_per_token, batch)
        return self.routed_expert_bytes * self.moe_layers * touched


def experts_touched(experts: int, per_token: int, batch: int) -> float:
    """Distinct experts `batch` tokens touch in a layer, each picking `per_token` of `experts` uniformly."""
    if experts <= 0 or not 0 < per_token <= experts:
        raise RooflineError(f"experts {experts} and experts per token {per_token} do not make a MoE layer")
    if batch <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - per_token / experts) ** batch)


def _moe_shape(config: Mapping[str, Any]) -> tuple[int, int, int]:
    try:
        layers = int(config["num_hidden_layers"])
        experts = int(config["n_routed_experts"])
        per_token = int(config["num_experts_per_tok"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RooflineError(
            f"config.json lacks {exc} (num_hidden_layers, n_routed_experts, num_experts_per_tok):"
            " not a MoE checkpoint"
        ) from exc
    dense_first = int(config.get("first_k_dense_replace") or 0)
    return layers - dense_first, experts, per_token


def groups_from_tensors(tensor_bytes: Mapping[str, int], config: Mapping[str, Any]) -> WeightGroups:
    """The groups from the checkpoint's own tensors (safetensors headers: name -> bytes)."""
    _, experts, per_token = _moe_shape(config)
    main_layers = int(config["num_hidden_layers"])
    routed = dense = 0
    expert_ids: set[tuple[int, int]] = set()
    for name, size in tensor_bytes.items():
        layer = LAYER.search(name)
        if MTP.search(name) or (layer and int(layer.group(1)) >= main_layers) or EMBEDDING.search(name):
            continue
        match = ROUTED_EXPERT.search(name)
        if match:
            routed += size
            expert_ids.add((int(match.group(1)), int(match.group(2))))
        else:
            dense += size
    if not expert_ids:
        raise RooflineError("no routed-expert tensor (layers.<L>.mlp.experts.<E>.) in the checkpoint")
    return WeightGroups(
        dense_bytes=dense,
        routed_expert_bytes=routed / len(expert_ids),
        moe_layers=len({layer for layer, _ in expert_ids}),
        experts=experts,
        experts_per_token=per_token,
        source="checkpoint tensors",
    )


def groups_from_config(config: Mapping[str, Any], dense_bytes: int) -> WeightGroups:
    """The groups from config.json alone, for a checkpoint not on this machine: routed experts as
    three NVFP4 matrices (gate, up, down) of hidden x moe_intermediate_size; the dense bytes given."""
    moe_layers, experts, per_token = _moe_shape(config)
    params = 3 * int(config["hidden_size"]) * int(config["moe_intermediate_size"])
    return WeightGroups(
        dense_bytes=dense_bytes,
        routed_expert_bytes=params * NVFP4_BYTES_PER_PARAM,
        moe_layers=moe_layers,
        experts=experts,
        experts_per_token=per_token,
        source="config.json (routed experts as NVFP4) and a stated dense size",
    )


def nvml_bandwidth_bytes_s(bus_width_bits: int, max_memory_clock_mhz: int) -> float:
    """Peak memory bandwidth from NVML's bus width and maximum memory clock: two transfers a clock
    (NVML reports the clock of double-data-rate memories at half their data rate)."""
    if bus_width_bits <= 0 or max_memory_clock_mhz <= 0:
        raise RooflineError(
            f"NVML gave bus width {bus_width_bits} bits and memory clock {max_memory_clock_mhz} MHz: set"
            " validation_gpu_memory_bandwidth_gb_s to the GPU's datasheet figure"
        )
    return 2 * max_memory_clock_mhz * 1e6 * bus_width_bits / 8


def step_bytes_per_gpu(groups: WeightGroups, tp: int, batch: int, kv_bytes_per_sequence: float) -> float:
    """Bytes one GPU of a TP-`tp` instance reads in a decode step of `batch` sequences."""
    if tp < 1:
        raise RooflineError(f"tensor parallel size {tp} is not at least 1")
    weights = (groups.dense_bytes + groups.routed_bytes_touched(batch)) / tp
    return weights + batch * kv_bytes_per_sequence


def instance_limit_tok_s(
    groups: WeightGroups, tp: int, batch: int, bandwidth_bytes_s: float, kv_bytes_per_sequence: float
) -> float:
    """Output tok/s of one decode instance at `batch` sequences, if memory bandwidth were all."""
    if batch <= 0:
        return 0.0
    return batch * bandwidth_bytes_s / step_bytes_per_gpu(groups, tp, batch, kv_bytes_per_sequence)


def layout_limit_tok_s(
    groups: WeightGroups,
    decode_tp: Sequence[int],
    concurrency: int,
    bandwidth_bytes_s: float,
    kv_bytes_per_sequence: float,
) -> float:
    """Output tok/s of every decode instance together (PD decodes or aggregated replicas), the
    `concurrency` requests spread as evenly as a router can (some instances get one more)."""
    if not decode_tp:
        raise RooflineError("the layout has no decode instance (no decode or aggregated role)")
    base, extra = divmod(concurrency, len(decode_tp))
    batches = [base + (1 if i < extra else 0) for i in range(len(decode_tp))]
    return sum(
        instance_limit_tok_s(groups, tp, batch, bandwidth_bytes_s, kv_bytes_per_sequence)
        for tp, batch in zip(decode_tp, batches, strict=True)
    )


def efficiency(measured_tok_s: float, limit_tok_s: float) -> float | None:
    """measured / limit, or None without a limit."""
    if not limit_tok_s or math.isnan(limit_tok_s):
        return None
    return measured_tok_s / limit_tok_s


# ---- The report's section (pd_bench_report on the measuring host) ----------------------------------


def decode_tp_sizes(engine_startup: Mapping[str, Mapping[str, Any]]) -> list[int]:
    """TP sizes of the running layout's decoding instances (every instance that is not a prefill),
    from what each engine started with: its CUDA_VISIBLE_DEVICES count."""
    sizes: list[int] = []
    for host in sorted(engine_startup):
        for name in sorted(engine_startup[host]):
            record = engine_startup[host][name] or {}
            if (record.get("choices") or {}).get("disaggregation_mode") == "prefill":
                continue
            devices = str((record.get("env") or {}).get("CUDA_VISIBLE_DEVICES", ""))
            count = len([d for d in devices.split(",") if d.strip()])
            if count:
                sizes.append(count)
    return sizes


def checkpoint_shards(model_dir: str | Path) -> list[Path]:
    """The checkpoint's shard files, or why there are none."""
    shards = sorted(Path(model_dir).glob("*.safetensors"))
    if not shards:
        raise RooflineError(f"no *.safetensors in {model_dir}: the checkpoint stage has not run")
    return shards


def checkpoint_groups(shards: Sequence[Path], config: Mapping[str, Any]) -> WeightGroups:
    """The tensor groups from the shards' headers and the checkpoint's config."""
    tensor_bytes: dict[str, int] = {}
    for shard in shards:
        tensor_bytes.update(read_safetensors_summary(shard).tensor_bytes)
    return groups_from_tensors(tensor_bytes, config)


def kv_bytes_per_token(config: Mapping[str, Any]) -> float:
    """KV bytes a token of context holds on each rank (DeepSeek-V4's pools as SGLang sizes them)."""
    return bytes_per_full_token(DeepSeekV4Shape.from_config(config))


def gpu_bandwidth(gpus: Sequence[Mapping[str, Any]], override_gb_s: float) -> tuple[float, str]:
    """Bytes/s a GPU reads at most, and where the figure comes from (the slowest GPU of the host)."""
    if override_gb_s > 0:
        return override_gb_s * 1e9, "validation_gpu_memory_bandwidth_gb_s"
    figures = [
        nvml_bandwidth_bytes_s(int(g["memory_bus_width_bits"]), int(g["memory_clock_max_mhz"]))
        for g in gpus
        if g.get("memory_bus_width_bits") and g.get("memory_clock_max_mhz")
    ]
    if not figures:
        raise RooflineError(
            "NVML gave no memory bus width and clock for this host's GPUs: set"
            " validation_gpu_memory_bandwidth_gb_s to the GPU's datasheet figure"
        )
    return min(figures), "NVML (bus width x 2 x maximum memory clock)"


def report_section(
    measurement: Mapping[str, Any],
    engine_startup: Mapping[str, Mapping[str, Any]],
    gpus: Sequence[Mapping[str, Any]],
    model_dir: str | Path,
    context_tokens: int,
    bandwidth_override_gb_s: float = 0.0,
) -> dict[str, Any]:
    """Limit and efficiency at each measured level of the running variant, or {"error": why}: a
    report is never refused for want of a roofline."""
    try:
        shards = checkpoint_shards(model_dir)
        config = load_config(model_dir)
        groups = checkpoint_groups(shards, config)
        kv_sequence = kv_bytes_per_token(config) * context_tokens
        bandwidth, bandwidth_source = gpu_bandwidth(gpus, bandwidth_override_gb_s)
        tp_sizes = decode_tp_sizes(engine_startup)
        levels = {}
        for phase in measurement.get("phases") or []:
            concurrency = int(phase["concurrency"])
            limit = layout_limit_tok_s(groups, tp_sizes, concurrency, bandwidth, kv_sequence)
            measured = float(phase.get("output_tok_s") or 0.0)
            levels[concurrency_label(concurrency)] = {
                "measured_tok_s": measured,
                "limit_tok_s": limit,
                "efficiency": efficiency(measured, limit),
            }
    except (RooflineError, ModelConfigError, SafetensorsFormatError, OSError, ValueError, KeyError) as err:
        return {"error": str(err)}
    section: dict[str, Any] = {
        "variant": measurement.get("variant"),
        "levels": levels,
        "decode_tp_sizes": tp_sizes,
        "bandwidth_gb_s": bandwidth / 1e9,
        "bandwidth_source": bandwidth_source,
        "dense_gb": groups.dense_bytes / 1e9,
        "routed_expert_mb": groups.routed_expert_bytes / 1e6,
        "moe_layers": groups.moe_layers,
        "experts": f"{groups.experts_per_token} of {groups.experts} a token",
        "kv_mb_per_sequence": kv_sequence / 1e6,
        "context_tokens": context_tokens,
        "groups_from": groups.source,
        "method": "docs/roofline.md: memory-bound decode without speculation (which may exceed it)",
    }
    stand_ins = sorted({str(gpu["stand_in"]) for gpu in gpus if gpu.get("stand_in")})
    if stand_ins:
        section["stand_in"] = (
            f"STAND-IN ({'; '.join(stand_ins)}) and a stand-in checkpoint; no figure of real hardware"
        )
    return section


def markdown(section: Mapping[str, Any] | None) -> list[str]:
    """The report's roofline lines."""
    if not section:
        return []
    lines = ["", "## Roofline (memory-bound decode limit, docs/roofline.md)", ""]
    if section.get("error"):
        return [*lines, f"Not computed: {section['error']}"]
    lines += [
        f"Variant {section['variant']}: decode TP sizes {section['decode_tp_sizes']}, "
        f"{section['bandwidth_gb_s']:.0f} GB/s a GPU ({section['bandwidth_source']}), dense "
        f"{section['dense_gb']:.2f} GB, an expert {section['routed_expert_mb']:.2f} MB x "
        f"{section['moe_layers']} layers ({section['experts']}), KV "
        f"{section['kv_mb_per_sequence']:.1f} MB a sequence ({section['context_tokens']} tokens).",
        "",
        *([f"{section['stand_in']}.", ""] if section.get("stand_in") else []),
        "| level | measured tok/s | limit tok/s | efficiency |",
        "| --- | --- | --- | --- |",
    ]
    for label, level in section["levels"].items():
        share = level["efficiency"]
        lines.append(
            f"| {label} | {level['measured_tok_s']:.1f} | {level['limit_tok_s']:.1f} | "
            f"{'n/a' if share is None else f'{share:.2%}'} |"
        )
    return lines
