"""DeepSeek-V4's KV cache bytes per token and KV pool size, as SGLang 0.5.23 computes them on sm_120.

Source (sglang 0.5.23 wheel): `srt/model_executor/pool_configurator.py` `DSV4PoolConfigurator`
(ratio-sizing mode: no --max-running-requests, no unified-KV, no HiSparse, FlashMLA "V4" layout,
which `srt/mem_cache/deepseek_v4_memory_pool.py` `select_dsv4_kv_layout` picks on any GPU that
is not SM100/SM103), `kernels/ops/attention/dsv4/kv_layout.py` `KVLayout.V4` (584 bytes a token:
448 FP8 nope + 64 BF16 rope + 8 scale bytes; pages padded to 576 bytes),
`srt/mem_cache/kv_cache_configurator.py` `resolve_max_num_reqs`, and
`srt/model_executor/model_runner_components/kv_pool_runtime.py` (headroom = memory before the
model load x (1 - --mem-fraction-static)).

Every layer keeps its last `window_size` tokens uncompressed (the SWA pool, sized at
DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO = 0.1 of the full pool), and a layer whose compress ratio is
4 or 128 also keeps every token compressed by that ratio (ratio 4 with a 132-byte FP8 indexer
entry a token). What is left out and why: SGLang's small fixed pools (c128 compress state, a few
MiB) and the per-page padding loop; the pool is within a page of SGLang's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARCHITECTURE = "DeepseekV4ForCausalLM"
# pool_configurator.py DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO.
SWA_FULL_TOKENS_RATIO = 0.1
# KVLayout.V4: bytes a token (data 576 + scale 8) and the TMA row stride pages are padded to.
V4_BYTES_PER_TOKEN = 584
V4_PAGE_ALIGN = 576
# DeepSeek-V4's page size on the CUDA path (pool_configurator asserts a multiple of 128).
PAGE_SIZE = 256
# SGLANG_DSV4_COMPRESS_STATE_DTYPE defaults to float32 (srt/environ.py).
COMPRESS_STATE_DTYPE_BYTES = 4
SUPPORTED_RATIOS = (0, 1, 2, 4, 128)
GIB = 1 << 30


class ModelConfigError(ValueError):
    """config.json is not a DeepSeek-V4 config this module can size; the message names the field."""


@dataclass(frozen=True)
class DeepSeekV4Shape:
    """The config.json fields that decide memory and transfer sizes."""

    num_hidden_layers: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    index_head_dim: int
    window_size: int
    compress_ratios: tuple[int, ...]
    max_position_embeddings: int
    num_nextn_predict_layers: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DeepSeekV4Shape:
        """Read a config.json dict; refuse another architecture or a missing/odd field by name."""
        architectures = config.get("architectures") or []
        if ARCHITECTURE not in architectures:
            raise ModelConfigError(f"config.json architectures is {architectures!r}, not [{ARCHITECTURE!r}]")
        values = {name: _int(config, name) for name in _INT_FIELDS}
        ratios = config.get("compress_ratios")
        if not isinstance(ratios, list) or len(ratios) < values["num_hidden_layers"]:
            raise ModelConfigError(
                f"config.json compress_ratios must list one ratio per layer "
                f"({values['num_hidden_layers']}), got {ratios!r}"
            )
        bad = sorted({r for r in ratios if r not in SUPPORTED_RATIOS})
        if bad:
            raise ModelConfigError(
                f"config.json compress_ratios has {bad}: SGLang supports {SUPPORTED_RATIOS}"
            )
        return cls(
            **values,
            compress_ratios=tuple(int(r) for r in ratios[: values["num_hidden_layers"]]),
            num_nextn_predict_layers=int(config.get("num_nextn_predict_layers") or 0),
        )

    def layers_with_ratio(self, ratio: int) -> int:
        return sum(1 for r in self.compress_ratios if r == ratio)


# Fields SGLang reads with a default when config.json lacks them (sglang 0.5.23
# srt/configs/deepseek_v4.py DeepSeekV4Config: the checkpoint's config.json names the window
# `sliding_window`, and SGLang keeps its own window_size default). None: required.
_INT_FIELDS: dict[str, int | None] = {
    "num_hidden_layers": None,
    "qk_nope_head_dim": 448,
    "qk_rope_head_dim": 64,
    "index_head_dim": 128,
    "window_size": 128,
    "max_position_embeddings": 65536,
}


def _int(config: Mapping[str, Any], name: str) -> int:
    value = config.get(name, _INT_FIELDS[name])
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"config.json {name} must be a positive integer, got {value!r}")
    return value


def load_config(model_dir: str | Path) -> dict[str, Any]:
    """The config.json of the checkpoint in `model_dir`, as a dict; a missing or unreadable file
    is a ModelConfigError naming it."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelConfigError(f"{path} does not exist: is {model_dir} a checkpoint directory?") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path} is not a JSON object")
    return config


def load_shape(model_dir: str | Path) -> DeepSeekV4Shape:
    """The shape of the checkpoint in `model_dir` (its config.json)."""
    return DeepSeekV4Shape.from_config(load_config(model_dir))


def v4_paged_bytes_per_token(page_tokens: int) -> float:
    """KVLayout.V4.page_bytes(page) / page: 584 bytes a token, the page padded to 576 bytes."""
    raw = page_tokens * V4_BYTES_PER_TOKEN
    return math.ceil(raw / V4_PAGE_ALIGN) * V4_PAGE_ALIGN / page_tokens


def _indexer_bytes_per_token(index_head_dim: int) -> int:
    """get_dsv4_indexer_bytes_per_token(use_fp4_indexer=False): FP8 values + a 4-byte scale per 128."""
    return index_head_dim + index_head_dim // 128 * 4


def compressed_bytes_per_token(shape: DeepSeekV4Shape) -> float:
    """Bytes one token adds to the compressed pools summed over the layers (_compressed_bytes_per_full_token).

    Ratios 1 and 2 count only on kv-source layers in SGLang; this checkpoint family has none, and
    they are counted on every layer here (an over-estimate, never an under-estimate)."""
    total = 0.0
    for ratio in (1, 2, 4, 128):
        layers = shape.layers_with_ratio(ratio)
        if not layers:
            continue
        paged = v4_paged_bytes_per_token(PAGE_SIZE // ratio)
        if ratio == 4:
            per_layer = paged / 4 + _indexer_bytes_per_token(shape.index_head_dim) / 4
        elif ratio == 128:
            per_layer = paged / 128
        else:
            per_layer = (paged + _indexer_bytes_per_token(shape.index_head_dim) // 2) / ratio
        total += per_layer * layers
    return total


def swa_bytes_per_token(shape: DeepSeekV4Shape, speculative: bool = False) -> float:
    """Bytes one SWA slot costs across the layers (_get_bytes_per_swa_token), c4 compress state included."""
    attn_head_dim = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    c4_state = 2 * 2 * attn_head_dim * COMPRESS_STATE_DTYPE_BYTES
    c4_index_state = 2 * 2 * shape.index_head_dim * COMPRESS_STATE_DTYPE_BYTES
    # deepseek_v4_memory_pool.get_compress_state_ring_size(4): 8 rows, 16 with speculation.
    c4_ring = 16 if speculative else 8
    return v4_paged_bytes_per_token(PAGE_SIZE) * shape.num_hidden_layers + (
        c4_ring / PAGE_SIZE * (c4_state + c4_index_state) * shape.layers_with_ratio(4)
    )


def bytes_per_full_token(shape: DeepSeekV4Shape, speculative: bool = False) -> float:
    """The pool's bytes per token of context per rank (MLA's single latent KV head: every TP rank
    holds it whole). With MTP the draft layer is reserved by inflating by (layers + 1) / layers."""
    swa = SWA_FULL_TOKENS_RATIO * swa_bytes_per_token(shape, speculative)
    per_token = swa + compressed_bytes_per_token(shape)
    if speculative:
        per_token *= (shape.num_hidden_layers + 1) / shape.num_hidden_layers
    return per_token


def weight_bytes_per_rank(checkpoint_bytes: int, tp_size: int) -> int:
    """Weights one TP rank holds: the checkpoint split evenly (experts and heads are TP-sharded;
    the replicated parts, embeddings and norms, are under 2 % of this checkpoint)."""
    if tp_size < 1:
        raise ValueError(f"tp_size must be at least 1, got {tp_size}")
    return math.ceil(checkpoint_bytes / tp_size)


@dataclass(frozen=True)
class KVPool:
    """One rank's KV pool as SGLang sizes it at start-up."""

    available_bytes: int
    bytes_per_token: float
    max_total_num_tokens: int
    max_running_requests: int
    context_length: int

    def requests_that_fit(self, tokens_per_request: int) -> int:
        """How many requests of this many tokens (prompt + output) the pool holds at once."""
        return min(self.max_running_requests, self.max_total_num_tokens // max(1, tokens_per_request))


def kv_pool(
    shape: DeepSeekV4Shape,
    *,
    gpu_memory_bytes: int,
    mem_fraction_static: float,
    weight_bytes: int,
    context_length: int | None = None,
    max_running_requests: int | None = None,
    speculative: bool = False,
) -> KVPool:
    """The KV pool of one rank: memory x fraction - weights, over the bytes a token costs.

    Raises ValueError, in SGLang's words, when nothing is left for the KV cache."""
    available = int(gpu_memory_bytes * mem_fraction_static) - weight_bytes
    if available <= 0:
        raise ValueError(
            f"Not enough memory. Please try to increase --mem-fraction-static. "
            f"(weights {weight_bytes / GIB:.1f} GiB, GPU {gpu_memory_bytes / GIB:.1f} GiB x "
            f"{mem_fraction_static} = {gpu_memory_bytes * mem_fraction_static / GIB:.1f} GiB)"
        )
    per_token = bytes_per_full_token(shape, speculative)
    tokens = int(available / per_token) // PAGE_SIZE * PAGE_SIZE
    context = context_length or shape.max_position_embeddings
    # kv_cache_configurator.resolve_max_num_reqs.
    estimated = max(min(int(tokens / context * 512), 4096), 2048)
    requests = min(max_running_requests or estimated, tokens // 2)
    return KVPool(available, per_token, tokens, requests, context)


def kv_transfer_bytes(shape: DeepSeekV4Shape, prompt_tokens: int) -> float:
    """Bytes one rank's prefill hands its decode for one prompt: every token compressed, plus the
    last window of uncompressed SWA KV on every layer (what the decode needs to continue)."""
    swa_tokens = min(prompt_tokens, shape.window_size)
    return (
        prompt_tokens * compressed_bytes_per_token(shape)
        + swa_tokens * v4_paged_bytes_per_token(PAGE_SIZE) * shape.num_hidden_layers
    )


def describe(shape: DeepSeekV4Shape, ratios: Sequence[int] = (0, 4, 128)) -> str:
    """One line for logs and reports."""
    counts = ", ".join(f"ratio {r}: {shape.layers_with_ratio(r)}" for r in ratios)
    per_token = bytes_per_full_token(shape)
    return f"{shape.num_hidden_layers} layers ({counts}), {per_token:.1f} KV bytes/token/rank"
