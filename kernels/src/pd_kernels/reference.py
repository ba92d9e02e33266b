"""Float64 reference and cache packing for the sparse-MLA decode kernel (tests, benchmarks).

The reference reads the same cache bytes as the kernel (FP8 e4m3 nope x UE8M0 scale, BF16 rope)
and does the arithmetic in float64, so a comparison measures the kernel's error alone.
"""

from __future__ import annotations

import math

import torch

from pd_kernels.sparse_mla_decode import (
    HEAD_DIM,
    NOPE_DIM,
    ROPE_DIM,
    SCALE_GROUP,
    TOKEN_DATA_BYTES,
    TOKEN_SCALE_BYTES,
)


def page_stride_bytes(page_size: int) -> int:
    """SGLang's page stride: data + scales, rounded up to whole 576-byte rows."""
    return math.ceil(page_size * (TOKEN_DATA_BYTES + TOKEN_SCALE_BYTES) / TOKEN_DATA_BYTES) * TOKEN_DATA_BYTES


def random_cache(
    num_pages: int,
    page_size: int = 256,
    *,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    exponent_range: tuple[int, int] = (-4, 2),
) -> torch.Tensor:
    """A paged cache filled with random tokens, as SGLang's [pages, page_size, 1, 584] byte view.

    Every byte of a page (pad bytes too) is written; nope values are FP8 e4m3 of N(0, 1), their
    scales 2**e with e uniform in exponent_range, rope values BF16 of N(0, 1).
    """
    stride = page_stride_bytes(page_size)
    raw = torch.randint(0, 256, (num_pages, stride), dtype=torch.uint8, generator=generator)
    tokens = num_pages * page_size
    nope = torch.randn(tokens, NOPE_DIM, generator=generator).clamp(-448, 448).to(torch.float8_e4m3fn)
    rope = torch.randn(tokens, ROPE_DIM, generator=generator).to(torch.bfloat16)
    lo, hi = exponent_range
    exps = torch.randint(127 + lo, 127 + hi + 1, (tokens, NOPE_DIM // SCALE_GROUP), generator=generator)
    data = torch.cat([nope.view(torch.uint8), rope.view(torch.uint8)], dim=1).view(num_pages, -1)
    raw[:, : page_size * TOKEN_DATA_BYTES] = data
    scales = torch.zeros(tokens, TOKEN_SCALE_BYTES, dtype=torch.uint8)
    scales[:, : NOPE_DIM // SCALE_GROUP] = exps.to(torch.uint8)
    scale_off = page_size * TOKEN_DATA_BYTES
    raw[:, scale_off : scale_off + page_size * TOKEN_SCALE_BYTES] = scales.view(num_pages, -1)
    raw = raw.to(device)
    bpt = TOKEN_DATA_BYTES + TOKEN_SCALE_BYTES
    return raw.as_strided((num_pages, page_size, 1, bpt), (stride, bpt, bpt, 1)).view(torch.float8_e4m3fn)


def dequantize_tokens(k_cache: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Token vectors [..., 512] in float64 from the cache bytes (tokens must be valid indices)."""
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    stride = k_cache.stride(0)
    pages = k_cache.as_strided((num_pages, stride), (stride, 1)).view(torch.uint8).cpu()
    flat = tokens.reshape(-1).long().cpu()
    page, slot = flat // page_size, flat % page_size
    data_cols = slot[:, None] * TOKEN_DATA_BYTES + torch.arange(TOKEN_DATA_BYTES)
    data = pages[page[:, None], data_cols]
    scale_cols = page_size * TOKEN_DATA_BYTES + slot[:, None] * TOKEN_SCALE_BYTES + torch.arange(7)
    exps = pages[page[:, None], scale_cols].double()
    nope = data[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).double()
    nope = nope * torch.exp2(exps - 127.0).repeat_interleave(SCALE_GROUP, dim=1)
    rope = data[:, NOPE_DIM:].contiguous().view(torch.bfloat16).double()
    return torch.cat([nope, rope], dim=1).reshape(*tokens.shape, HEAD_DIM)


def _gather(
    k_cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    batch = indices.shape[0]
    idx = indices.long().cpu()
    valid = idx >= 0
    if topk_length is not None:
        pos = torch.arange(idx.shape[-1]).view(1, 1, -1)
        valid &= pos < topk_length.long().cpu().view(batch, 1, 1)
    kv = dequantize_tokens(k_cache, idx.clamp(min=0))
    return kv, valid


def reference_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    softmax_scale: float,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, S_q, H, 512], lse [B, H, S_q]) in float64 on the CPU, same conventions as the kernel."""
    kv, valid = _gather(k_cache, indices, topk_length)
    if extra_k_cache is not None and extra_indices is not None:
        kv2, valid2 = _gather(extra_k_cache, extra_indices, extra_topk_length)
        kv, valid = torch.cat([kv, kv2], dim=2), torch.cat([valid, valid2], dim=2)
    kv = torch.where(valid[..., None], kv, 0.0)
    scores = torch.einsum("bshd,bstd->bsht", q.double().cpu(), kv) * softmax_scale
    scores = scores.masked_fill(~valid[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, S_q, H]
    denom = lse
    if attn_sink is not None:
        denom = torch.logaddexp(lse, attn_sink.double().cpu().view(1, 1, -1).expand_as(lse))
    empty = lse == float("-inf")
    weights = torch.exp(scores - torch.where(empty, 0.0, denom)[..., None])
    weights = torch.where(empty[..., None], 0.0, weights)
    out = torch.einsum("bsht,bstd->bshd", weights, kv)
    return out, lse.permute(0, 2, 1)


def random_indices(
    batch: int,
    topk: int,
    num_tokens: int,
    *,
    invalid_fraction: float = 0.0,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """[B, 1, topk] int32 distinct random token indices, a fraction of them -1."""
    keys = torch.rand(batch, num_tokens, generator=generator)
    idx = keys.topk(topk, dim=1).indices.to(torch.int32) if topk <= num_tokens else None
    if idx is None:
        raise ValueError(f"topk {topk} exceeds the {num_tokens} tokens of the cache")
    if invalid_fraction > 0:
        drop = torch.rand(batch, topk, generator=generator) < invalid_fraction
        idx = torch.where(drop, torch.full_like(idx, -1), idx)
    return idx.view(batch, 1, topk).to(device)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (0 when both are zero)."""
    diff = float((out.double().cpu() - ref.double().cpu()).norm().item())
    norm = float(ref.double().cpu().norm().item())
    return diff / norm if norm > 0 else diff
