"""Split-KV, head-batched sparse-MLA decode for SGLang's DeepSeek-V4 paged FP8 cache.

Same contract as SGLang 0.5.23's ``flash_mla_sparse_decode_triton`` (the sm_120 fallback), a
different schedule:

* every head of a row is one M row of a tensor-core dot, so a KV tile is gathered and
  dequantized once per program for all of its heads (upstream: once per head);
* the row's top-k tiles (SWA cache first, then the extra/compressed cache) are split across
  programs, so a batch of one still spreads over the GPU; a second small launch merges the
  splits and applies the attention sink. With one split the first launch finishes the row
  itself, so a call is one or two launches, no host synchronisation, CUDA-graph capturable;
* it reads SGLang's native pages (any page size, 256 in practice) and takes any head count,
  so the 64-head padding that upstream's sm_120 decode needs can be dropped.

Cache layout (per page of ``page_size`` tokens; page stride = ``k_cache.stride(0)`` bytes):
``page_size * 576`` data bytes (per token 448 FP8 e4m3 "nope" values, then 64 BF16 "rope"
values) followed by ``page_size * 8`` scale bytes (per token 7 UE8M0 exponents, one per 64
nope values, and one pad byte).

Output convention (that of SGLang's torch reference ``_sm120_sparse_decode_fwd``):
``out`` [B, S_q, H, 512] bf16 is softmax(q k^T * scale) v with the sink added to the
denominator; ``lse`` [B, H, S_q] fp32 is the natural-log sum-exp of the valid scores *without*
the sink; a row with no valid token gives ``out = 0`` and ``lse = -inf``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

NOPE_DIM = 448
ROPE_DIM = 64
HEAD_DIM = NOPE_DIM + ROPE_DIM  # 512
TOKEN_DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576
TOKEN_SCALE_BYTES = 8  # 7 UE8M0 exponents + 1 pad
SCALE_GROUP = 64
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _gather(
    tile, end_tile, row, valid_len, idx_ptr, idx_stride, topk,
    fp8_ptr, u8_ptr, bf16_ptr, page_size, page_bytes, scale_off, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Issue the loads of one tile of BLOCK_N tokens: 7 FP8 groups of 64, the BF16 rope, the exponents.

    Tokens past the tile range, past valid_len or with index -1 read token 0 and are masked later.
    """
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    in_range = (offs_n < topk) & (offs_n < end_tile * BLOCK_N)  # tile < end_tile, as a vector
    raw = tl.load(idx_ptr + row.to(tl.int64) * idx_stride + offs_n, mask=in_range, other=-1)
    valid = (offs_n < valid_len) & (raw >= 0)
    tok = tl.where(valid, raw, 0).to(tl.int64)
    page = tok // page_size
    slot = tok - page * page_size
    base = page * page_bytes
    data = base + slot * 576  # byte offset of the token's 576 data bytes
    lane = tl.arange(0, 64)
    p8 = fp8_ptr + (data[:, None] + lane[None, :])
    n0 = tl.load(p8)
    n1 = tl.load(p8 + 64)
    n2 = tl.load(p8 + 128)
    n3 = tl.load(p8 + 192)
    n4 = tl.load(p8 + 256)
    n5 = tl.load(p8 + 320)
    n6 = tl.load(p8 + 384)
    rope = tl.load(bf16_ptr + ((data // 2 + 224)[:, None] + lane[None, :]))
    exps = tl.load(u8_ptr + ((base + scale_off + slot * 8)[:, None] + tl.arange(0, 8)[None, :]))
    return valid, n0, n1, n2, n3, n4, n5, n6, rope, exps


@triton.jit
def _dequant(n, exps, g: tl.constexpr, valid, DOT_DTYPE: tl.constexpr):
    """FP8 group g times its UE8M0 scale 2**(e - 127), built from the exponent's bits.

    FP8 x 2**e is exact in bf16 (and in fp16 for the interpreter's test ranges); e == 0 gives 0
    instead of 2**-127.
    """
    e = tl.sum(tl.where(tl.arange(0, 8)[None, :] == g, exps.to(tl.int32), 0), 1)
    scale = (e << 23).to(tl.float32, bitcast=True).to(DOT_DTYPE)
    return tl.where(valid[:, None], n.to(DOT_DTYPE) * scale[:, None], 0.0)


@triton.jit
def _attend(
    q0, q1, q2, q3, q4, q5, q6, q7,
    m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7,
    valid, n0, n1, n2, n3, n4, n5, n6, rope, exps,
    qk_scale_log2, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """Fold one gathered tile into every head: 8 independent QK dots (one per 64 dims), online
    softmax in base 2, 8 independent PV dots into the per-group accumulators."""
    k0 = _dequant(n0, exps, 0, valid, DOT_DTYPE)
    k1 = _dequant(n1, exps, 1, valid, DOT_DTYPE)
    k2 = _dequant(n2, exps, 2, valid, DOT_DTYPE)
    k3 = _dequant(n3, exps, 3, valid, DOT_DTYPE)
    k4 = _dequant(n4, exps, 4, valid, DOT_DTYPE)
    k5 = _dequant(n5, exps, 5, valid, DOT_DTYPE)
    k6 = _dequant(n6, exps, 6, valid, DOT_DTYPE)
    k7 = tl.where(valid[:, None], rope.to(DOT_DTYPE), 0.0)
    s = (
        (tl.dot(q0, tl.trans(k0)) + tl.dot(q1, tl.trans(k1)))
        + (tl.dot(q2, tl.trans(k2)) + tl.dot(q3, tl.trans(k3)))
    ) + (
        (tl.dot(q4, tl.trans(k4)) + tl.dot(q5, tl.trans(k5)))
        + (tl.dot(q6, tl.trans(k6)) + tl.dot(q7, tl.trans(k7)))
    )
    s = tl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha_h = tl.math.exp2(m_i - m_new)
    alpha = alpha_h[:, None]
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha_h + tl.sum(p, 1)
    p = p.to(DOT_DTYPE)
    a0 = tl.dot(p, k0, a0 * alpha)
    a1 = tl.dot(p, k1, a1 * alpha)
    a2 = tl.dot(p, k2, a2 * alpha)
    a3 = tl.dot(p, k3, a3 * alpha)
    a4 = tl.dot(p, k4, a4 * alpha)
    a5 = tl.dot(p, k5, a5 * alpha)
    a6 = tl.dot(p, k6, a6 * alpha)
    a7 = tl.dot(p, k7, a7 * alpha)
    return m_new, l_i, a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _row_weight(l_i, m_i):
    """(1 / l for the unnormalised accumulators, base-2 lse) of a split's rows; -inf when empty."""
    has_any = l_i > 0.0
    safe_l = tl.where(has_any, l_i, 1.0)
    lse2 = tl.where(has_any, m_i + tl.math.log2(safe_l), float("-inf"))
    return 1.0 / safe_l, lse2


@triton.jit
def _sink_weight(lse2, sink2, HAS_SINK: tl.constexpr):
    """e^lse / (e^lse + e^sink) without overflow (1 without a sink), 0 for a row with no token."""
    w = tl.where(lse2 == float("-inf"), 0.0, 1.0)
    if HAS_SINK:
        w = w / (1.0 + tl.math.exp2(tl.minimum(sink2 - lse2, 126.0)))
    return w


@triton.jit
def _to_bf16(x, EMULATE_RNE: tl.constexpr):
    """fp32 -> bf16, round to nearest even. The Triton interpreter truncates instead (twice the
    error), so there the rounding is done on the bits first and the cast is then exact."""
    if EMULATE_RNE:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _lse_ptrs(lse_ptr, row, s_q, H, offs_h):
    """lse is [B, H, S_q] (upstream's permuted layout): row b * S_q + s, head stride S_q."""
    batch = row // s_q
    return lse_ptr + batch * H * s_q + (row - batch * s_q) + offs_h * s_q


@triton.jit
def _split_kernel(
    q_ptr,
    q_stride_r,
    q_stride_h,
    idx1_ptr,
    idx1_stride,
    topk1,
    len1_ptr,
    fp8_1,
    u8_1,
    bf16_1,
    page_size1,
    page_bytes1,
    scale_off1,
    idx2_ptr,
    idx2_stride,
    topk2,
    len2_ptr,
    fp8_2,
    u8_2,
    bf16_2,
    page_size2,
    page_bytes2,
    scale_off2,
    sink_ptr,
    out_ptr,
    out_stride_r,
    out_stride_h,
    lse_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    H,
    s_q,
    num_splits,
    tiles_per_split,
    qk_scale_log2,
    HAS_LEN1: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    HAS_LEN2: tl.constexpr,
    HAS_SINK: tl.constexpr,
    FINAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    EMULATE_RNE: tl.constexpr,
):
    """Grid (head blocks, splits, rows): one program folds tiles_per_split tiles into BLOCK_H heads.

    The next tile's loads are issued before the current tile is computed (software pipelining in
    registers), so the gather latency overlaps the dots.
    """
    hb = tl.program_id(0)
    split = tl.program_id(1)
    row = tl.program_id(2)
    batch = row // s_q
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    lane = tl.arange(0, 64)
    q_ptrs = q_ptr + row.to(tl.int64) * q_stride_r + offs_h[:, None] * q_stride_h + lane[None, :]
    q0 = tl.load(q_ptrs + 0, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    q1 = tl.load(q_ptrs + 64, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    q2 = tl.load(q_ptrs + 128, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    q3 = tl.load(q_ptrs + 192, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    q4 = tl.load(q_ptrs + 256, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    q5 = tl.load(q_ptrs + 320, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    q6 = tl.load(q_ptrs + 384, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    q7 = tl.load(q_ptrs + 448, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)  # finite: an all-masked tile leaves alpha = 1
    l_i = tl.zeros([BLOCK_H], tl.float32)
    a0 = tl.zeros([BLOCK_H, 64], tl.float32)
    a1 = tl.zeros([BLOCK_H, 64], tl.float32)
    a2 = tl.zeros([BLOCK_H, 64], tl.float32)
    a3 = tl.zeros([BLOCK_H, 64], tl.float32)
    a4 = tl.zeros([BLOCK_H, 64], tl.float32)
    a5 = tl.zeros([BLOCK_H, 64], tl.float32)
    a6 = tl.zeros([BLOCK_H, 64], tl.float32)
    a7 = tl.zeros([BLOCK_H, 64], tl.float32)
    first = split * tiles_per_split
    last = first + tiles_per_split
    len1 = topk1
    if HAS_LEN1:
        len1 = tl.minimum(tl.load(len1_ptr + batch), topk1)
    end1 = tl.minimum(last, tl.cdiv(tl.maximum(len1, 0), BLOCK_N))
    valid, n0, n1, n2, n3, n4, n5, n6, rope, exps = _gather(
        first, end1, row, len1, idx1_ptr, idx1_stride, topk1,
        fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1, BLOCK_N,
    )  # fmt: skip
    for tile in range(first, end1):
        nvalid, nn0, nn1, nn2, nn3, nn4, nn5, nn6, nrope, nexps = _gather(
            tile + 1, end1, row, len1, idx1_ptr, idx1_stride, topk1,
            fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1, BLOCK_N,
        )  # fmt: skip
        m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7 = _attend(
            q0, q1, q2, q3, q4, q5, q6, q7,
            m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7,
            valid, n0, n1, n2, n3, n4, n5, n6, rope, exps, qk_scale_log2, DOT_DTYPE,
        )  # fmt: skip
        valid, n0, n1, n2, n3, n4, n5, n6, rope, exps = (
            nvalid,
            nn0,
            nn1,
            nn2,
            nn3,
            nn4,
            nn5,
            nn6,
            nrope,
            nexps,
        )
    if HAS_EXTRA:
        base2 = tl.cdiv(topk1, BLOCK_N)  # the extra cache's tiles follow all of the SWA tiles
        len2 = topk2
        if HAS_LEN2:
            len2 = tl.minimum(tl.load(len2_ptr + batch), topk2)
        first2 = tl.maximum(first - base2, 0)
        end2 = tl.minimum(last - base2, tl.cdiv(tl.maximum(len2, 0), BLOCK_N))
        valid, n0, n1, n2, n3, n4, n5, n6, rope, exps = _gather(
            first2, end2, row, len2, idx2_ptr, idx2_stride, topk2,
            fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2, BLOCK_N,
        )  # fmt: skip
        for tile in range(first2, end2):
            nvalid, nn0, nn1, nn2, nn3, nn4, nn5, nn6, nrope, nexps = _gather(
                tile + 1, end2, row, len2, idx2_ptr, idx2_stride, topk2,
                fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2, BLOCK_N,
            )  # fmt: skip
            m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7 = _attend(
                q0, q1, q2, q3, q4, q5, q6, q7,
            m_i, l_i, a0, a1, a2, a3, a4, a5, a6, a7,
            valid, n0, n1, n2, n3, n4, n5, n6, rope, exps, qk_scale_log2, DOT_DTYPE,
            )  # fmt: skip
            valid, n0, n1, n2, n3, n4, n5, n6, rope, exps = (
                nvalid,
                nn0,
                nn1,
                nn2,
                nn3,
                nn4,
                nn5,
                nn6,
                nrope,
                nexps,
            )

    inv_l, lse2 = _row_weight(l_i, m_i)
    if FINAL:
        sink2 = lse2
        if HAS_SINK:
            sink2 = tl.load(sink_ptr + offs_h, mask=h_mask, other=0.0).to(tl.float32) * 1.4426950408889634
        factor = (inv_l * _sink_weight(lse2, sink2, HAS_SINK))[:, None]
        o_ptrs = out_ptr + row.to(tl.int64) * out_stride_r + offs_h[:, None] * out_stride_h + lane[None, :]
        lse = tl.where(lse2 == float("-inf"), float("-inf"), lse2 * 0.6931471805599453)
        tl.store(_lse_ptrs(lse_ptr, row, s_q, H, offs_h), lse, mask=h_mask)
    else:
        factor = inv_l[:, None]
        mid = (row.to(tl.int64) * H + offs_h) * num_splits + split  # [rows, H, splits]
        o_ptrs = mid_o_ptr + mid[:, None] * 512 + lane[None, :]
        tl.store(mid_lse_ptr + mid, lse2, mask=h_mask)
    if FINAL:
        tl.store(o_ptrs + 0, _to_bf16(a0 * factor, EMULATE_RNE), mask=h_mask[:, None])
        tl.store(o_ptrs + 64, _to_bf16(a1 * factor, EMULATE_RNE), mask=h_mask[:, None])
        tl.store(o_ptrs + 128, _to_bf16(a2 * factor, EMULATE_RNE), mask=h_mask[:, None])
        tl.store(o_ptrs + 192, _to_bf16(a3 * factor, EMULATE_RNE), mask=h_mask[:, None])
        tl.store(o_ptrs + 256, _to_bf16(a4 * factor, EMULATE_RNE), mask=h_mask[:, None])
        tl.store(o_ptrs + 320, _to_bf16(a5 * factor, EMULATE_RNE), mask=h_mask[:, None])
        tl.store(o_ptrs + 384, _to_bf16(a6 * factor, EMULATE_RNE), mask=h_mask[:, None])
        tl.store(o_ptrs + 448, _to_bf16(a7 * factor, EMULATE_RNE), mask=h_mask[:, None])
    else:
        tl.store(o_ptrs + 0, a0 * factor, mask=h_mask[:, None])
        tl.store(o_ptrs + 64, a1 * factor, mask=h_mask[:, None])
        tl.store(o_ptrs + 128, a2 * factor, mask=h_mask[:, None])
        tl.store(o_ptrs + 192, a3 * factor, mask=h_mask[:, None])
        tl.store(o_ptrs + 256, a4 * factor, mask=h_mask[:, None])
        tl.store(o_ptrs + 320, a5 * factor, mask=h_mask[:, None])
        tl.store(o_ptrs + 384, a6 * factor, mask=h_mask[:, None])
        tl.store(o_ptrs + 448, a7 * factor, mask=h_mask[:, None])


@triton.jit
def _combine_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    sink_ptr,
    out_ptr,
    out_stride_r,
    out_stride_h,
    lse_ptr,
    H,
    s_q,
    num_splits,
    HAS_SINK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_HC: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EMULATE_RNE: tl.constexpr,
):
    """Grid (head blocks, rows, 512 / BLOCK_D): merge the splits' (out, lse2), then sink and empty rows.

    All splits of a block are loaded at once, so the latency does not grow with the split count.
    """
    hb = tl.program_id(0)
    row = tl.program_id(1)
    chunk = tl.program_id(2)
    offs_h = hb * BLOCK_HC + tl.arange(0, BLOCK_HC)
    h_mask = offs_h < H
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = chunk * BLOCK_D + tl.arange(0, BLOCK_D)
    mask2 = h_mask[:, None] & (offs_s < num_splits)[None, :]
    mid = (row.to(tl.int64) * H + offs_h[:, None]) * num_splits + offs_s[None, :]  # [HC, S]
    lse_s = tl.load(mid_lse_ptr + mid, mask=mask2, other=float("-inf"))
    top = tl.max(lse_s, 1)
    top_safe = tl.where(top == float("-inf"), 0.0, top)
    w = tl.math.exp2(lse_s - top_safe[:, None])  # 0 for empty splits
    total = tl.sum(w, 1)
    o = tl.load(mid_o_ptr + mid[:, :, None] * 512 + offs_d[None, None, :], mask=mask2[:, :, None], other=0.0)
    has_any = total > 0.0
    safe_total = tl.where(has_any, total, 1.0)
    lse2 = tl.where(has_any, top_safe + tl.math.log2(safe_total), float("-inf"))
    sink2 = lse2
    if HAS_SINK:
        sink2 = tl.load(sink_ptr + offs_h, mask=h_mask, other=0.0).to(tl.float32) * 1.4426950408889634
    factor = _sink_weight(lse2, sink2, HAS_SINK) / safe_total
    out = tl.sum(w[:, :, None] * o, 1) * factor[:, None]
    o_ptrs = out_ptr + row.to(tl.int64) * out_stride_r + offs_h[:, None] * out_stride_h + offs_d[None, :]
    tl.store(o_ptrs, _to_bf16(out, EMULATE_RNE), mask=h_mask[:, None])
    if chunk == 0:
        lse = tl.where(has_any, lse2 * 0.6931471805599453, float("-inf"))
        tl.store(_lse_ptrs(lse_ptr, row, s_q, H, offs_h), lse, mask=h_mask)


@triton.jit
def _tile_tokens(
    tile, row, valid_len, idx_ptr, idx_stride, topk, page_size, page_bytes, BLOCK_N: tl.constexpr
):  # fmt: skip
    """Token slots of one tile: (local offsets, valid mask, page byte base, slot in page)."""
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    raw = tl.load(idx_ptr + row.to(tl.int64) * idx_stride + offs_n, mask=offs_n < topk, other=-1)
    valid = (offs_n < valid_len) & (raw >= 0)
    tok = tl.where(valid, raw, 0).to(tl.int64)
    page = tok // page_size
    slot = tok - page * page_size
    return offs_n, valid, page * page_bytes, slot


@triton.jit
def _score_tile(
    q_row, q_stride_h, offs_h, h_mask, s_rows, col0,
    tile, row, valid_len, idx_ptr, idx_stride, topk,
    fp8_ptr, u8_ptr, bf16_ptr, page_size, page_bytes, scale_off, qk_scale_log2,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """Scores (base 2, -inf where invalid) of BLOCK_H heads x one tile of BLOCK_N tokens."""
    offs_n, valid, base, slot = _tile_tokens(
        tile, row, valid_len, idx_ptr, idx_stride, topk, page_size, page_bytes, BLOCK_N
    )
    data = base + slot * 576
    lane = tl.arange(0, 64)
    q_ptrs = q_row + offs_h[:, None] * q_stride_h + lane[None, :]
    e_ptrs = u8_ptr + base + scale_off + slot * 8
    acc = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
    for g in tl.static_range(7):
        n = tl.load(fp8_ptr + (data[:, None] + g * 64 + lane[None, :]))
        e = tl.load(e_ptrs + g).to(tl.int32)
        scale = (e << 23).to(tl.float32, bitcast=True).to(DOT_DTYPE)
        k = tl.where(valid[:, None], n.to(DOT_DTYPE) * scale[:, None], 0.0)
        qg = tl.load(q_ptrs + g * 64, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
        acc = tl.dot(qg, tl.trans(k), acc)
    rope = tl.load(bf16_ptr + ((data // 2 + 224)[:, None] + lane[None, :]))
    k7 = tl.where(valid[:, None], rope.to(DOT_DTYPE), 0.0)
    q7 = tl.load(q_ptrs + 448, mask=h_mask[:, None], other=0.0).to(DOT_DTYPE)
    acc = tl.dot(q7, tl.trans(k7), acc)
    s = tl.where(valid[None, :], acc * qk_scale_log2, float("-inf"))
    tl.store(s_rows + col0 + offs_n[None, :], s, mask=h_mask[:, None] & (offs_n < topk)[None, :])


@triton.jit
def _scores_kernel(
    q_ptr, q_stride_r, q_stride_h,
    idx1_ptr, idx1_stride, topk1, len1_ptr, fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1,
    idx2_ptr, idx2_stride, topk2, len2_ptr, fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2,
    s_ptr, H, s_q, s_cols, qk_scale_log2,
    HAS_LEN1: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_LEN2: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """Two-phase path, phase 1. Grid (tiles of both caches, head blocks, rows): one program scores
    one tile of BLOCK_N tokens for BLOCK_H heads (the full 512-dim dot, K dequantized once for all
    of them) into s [rows, H, s_cols]; tiles past the row's valid length are skipped (never read)."""
    t = tl.program_id(0)
    hb = tl.program_id(1)
    row = tl.program_id(2)
    batch = row // s_q
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    q_row = q_ptr + row.to(tl.int64) * q_stride_r
    s_rows = s_ptr + (row.to(tl.int64) * H + offs_h)[:, None] * s_cols
    tiles1 = tl.cdiv(topk1, BLOCK_N)
    if t < tiles1:
        len1 = topk1
        if HAS_LEN1:
            len1 = tl.minimum(tl.load(len1_ptr + batch), topk1)
        if t * BLOCK_N < len1:
            _score_tile(
                q_row, q_stride_h, offs_h, h_mask, s_rows, 0,
                t, row, len1, idx1_ptr, idx1_stride, topk1,
                fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1, qk_scale_log2,
                BLOCK_H, BLOCK_N, DOT_DTYPE,
            )  # fmt: skip
    elif HAS_EXTRA:
        len2 = topk2
        if HAS_LEN2:
            len2 = tl.minimum(tl.load(len2_ptr + batch), topk2)
        t2 = t - tiles1
        if t2 * BLOCK_N < len2:
            _score_tile(
                q_row, q_stride_h, offs_h, h_mask, s_rows, tiles1 * BLOCK_N,
                t2, row, len2, idx2_ptr, idx2_stride, topk2,
                fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2, qk_scale_log2,
                BLOCK_H, BLOCK_N, DOT_DTYPE,
            )  # fmt: skip


@triton.jit
def _pv_loop(
    m_i, l_i, acc, s_rows, col0, h_mask, d, group,
    row, valid_len, idx_ptr, idx_stride, topk,
    fp8_ptr, u8_ptr, bf16_ptr, page_size, page_bytes, scale_off,
    BLOCK_N: tl.constexpr, IS_ROPE: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """All tiles of one cache: online softmax over the stored scores, then P x V into this
    program's BLOCK_D dims (FP8 times the group's UE8M0 scale, or the BF16 rope)."""
    for tile in range(0, tl.cdiv(tl.maximum(valid_len, 0), BLOCK_N)):
        offs_n, valid, base, slot = _tile_tokens(
            tile, row, valid_len, idx_ptr, idx_stride, topk, page_size, page_bytes, BLOCK_N
        )
        data = base + slot * 576
        s = tl.load(
            s_rows + col0 + offs_n[None, :], mask=h_mask[:, None] & valid[None, :], other=float("-inf")
        )
        if IS_ROPE:
            r = tl.load(bf16_ptr + ((data // 2 + 224)[:, None] + (d - 448)[None, :]))
            v = tl.where(valid[:, None], r.to(DOT_DTYPE), 0.0)
        else:
            n = tl.load(fp8_ptr + (data[:, None] + d[None, :]))
            e = tl.load(u8_ptr + base + scale_off + slot * 8 + group).to(tl.int32)
            scale = (e << 23).to(tl.float32, bitcast=True).to(DOT_DTYPE)
            v = tl.where(valid[:, None], n.to(DOT_DTYPE) * scale[:, None], 0.0)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(DOT_DTYPE), v, acc * alpha[:, None])
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _pv_row(
    m_i, l_i, acc, s_rows, h_mask, d, group, row, batch,
    idx1_ptr, idx1_stride, topk1, len1_ptr, fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1,
    idx2_ptr, idx2_stride, topk2, len2_ptr, fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2,
    HAS_LEN1: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_LEN2: tl.constexpr,
    BLOCK_N: tl.constexpr, IS_ROPE: tl.constexpr, DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """The SWA cache's tiles, then the extra cache's (its scores follow the SWA tiles' columns)."""
    len1 = topk1
    if HAS_LEN1:
        len1 = tl.minimum(tl.load(len1_ptr + batch), topk1)
    m_i, l_i, acc = _pv_loop(
        m_i, l_i, acc, s_rows, 0, h_mask, d, group, row, len1, idx1_ptr, idx1_stride, topk1,
        fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1, BLOCK_N, IS_ROPE, DOT_DTYPE,
    )  # fmt: skip
    if HAS_EXTRA:
        len2 = topk2
        if HAS_LEN2:
            len2 = tl.minimum(tl.load(len2_ptr + batch), topk2)
        m_i, l_i, acc = _pv_loop(
            m_i, l_i, acc, s_rows, tl.cdiv(topk1, BLOCK_N) * BLOCK_N, h_mask, d, group,
            row, len2, idx2_ptr, idx2_stride, topk2,
            fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2, BLOCK_N, IS_ROPE, DOT_DTYPE,
        )  # fmt: skip
    return m_i, l_i, acc


@triton.jit
def _pv_kernel(
    idx1_ptr, idx1_stride, topk1, len1_ptr, fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1,
    idx2_ptr, idx2_stride, topk2, len2_ptr, fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2,
    s_ptr, sink_ptr, out_ptr, out_stride_r, out_stride_h, lse_ptr, H, s_q, s_cols,
    HAS_LEN1: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_LEN2: tl.constexpr, HAS_SINK: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr,
    EMULATE_RNE: tl.constexpr,
):  # fmt: skip
    """Two-phase path, phase 2. Grid (512 / BLOCK_D, head blocks, rows): softmax over the row's
    stored scores and the BLOCK_D output dims of BLOCK_H heads, so each V slice is gathered and
    dequantized once per head block; then the sink, the empty-row convention, out and lse."""
    c = tl.program_id(0)
    hb = tl.program_id(1)
    row = tl.program_id(2)
    batch = row // s_q
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    d = c * BLOCK_D + tl.arange(0, BLOCK_D)
    group = (c * BLOCK_D) // 64
    s_rows = s_ptr + (row.to(tl.int64) * H + offs_h)[:, None] * s_cols
    m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    if c * BLOCK_D < 448:
        m_i, l_i, acc = _pv_row(
            m_i, l_i, acc, s_rows, h_mask, d, group, row, batch,
            idx1_ptr, idx1_stride, topk1, len1_ptr, fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1,
            idx2_ptr, idx2_stride, topk2, len2_ptr, fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2,
            HAS_LEN1, HAS_EXTRA, HAS_LEN2, BLOCK_N, False, DOT_DTYPE,
        )  # fmt: skip
    else:
        m_i, l_i, acc = _pv_row(
            m_i, l_i, acc, s_rows, h_mask, d, group, row, batch,
            idx1_ptr, idx1_stride, topk1, len1_ptr, fp8_1, u8_1, bf16_1, page_size1, page_bytes1, scale_off1,
            idx2_ptr, idx2_stride, topk2, len2_ptr, fp8_2, u8_2, bf16_2, page_size2, page_bytes2, scale_off2,
            HAS_LEN1, HAS_EXTRA, HAS_LEN2, BLOCK_N, True, DOT_DTYPE,
        )  # fmt: skip
    inv_l, lse2 = _row_weight(l_i, m_i)
    sink2 = lse2
    if HAS_SINK:
        sink2 = tl.load(sink_ptr + offs_h, mask=h_mask, other=0.0).to(tl.float32) * 1.4426950408889634
    factor = (inv_l * _sink_weight(lse2, sink2, HAS_SINK))[:, None]
    o_ptrs = out_ptr + row.to(tl.int64) * out_stride_r + offs_h[:, None] * out_stride_h + d[None, :]
    tl.store(o_ptrs, _to_bf16(acc * factor, EMULATE_RNE), mask=h_mask[:, None])
    if c == 0:
        lse = tl.where(lse2 == float("-inf"), float("-inf"), lse2 * 0.6931471805599453)
        tl.store(_lse_ptrs(lse_ptr, row, s_q, H, offs_h), lse, mask=h_mask)


@dataclass(frozen=True)
class LaunchConfig:
    """Tile shape and split count of one call (derived from shapes only, so graph-safe)."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    num_splits: int
    tiles_per_split: int
    # Two-phase path (large batches): scores kernel, then a softmax x V kernel per BLOCK_D dims.
    two_phase: bool = False
    block_d: int = 64
    pv_warps: int = 4
    pv_block_h: int = 0  # heads per phase-2 program; 0: block_h


_SM_COUNT: dict[int, int] = {}
# The compiled kernels of the latest call (None under the interpreter), for resource checks.
LAST_LAUNCH: dict[str, object] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def choose_config(
    rows: int,
    num_heads: int,
    total_tiles: int,
    sm_count: int,
    *,
    block_h: int = 16,
    block_n: int = 16,
    num_warps: int = 4,
    num_stages: int = 1,
    programs_per_sm: int = 2,
    min_tiles_per_split: int = 1,
    max_splits: int = 64,
    num_splits: int | None = None,
) -> LaunchConfig:
    """16 heads x 16 tokens per step (fits sm_120's 99 KB shared memory twice, no spills), then
    enough splits of the top-k that rows x head blocks x splits fills programs_per_sm per SM, with
    at least min_tiles_per_split tiles each. Measured on the H200 (benchmarks/results): one tile per
    split was 1-2 us faster at B <= 4 than two and the same within noise above; 1, 2 and 4
    programs per SM are within 10% of each other except at B=64 H=64 (one split, 15% faster)."""
    head_blocks = triton.cdiv(num_heads, block_h)
    tiles = max(1, total_tiles)
    if num_splits is None:
        num_splits = triton.cdiv(programs_per_sm * sm_count, max(1, rows * head_blocks))
        # The merge holds every split of a (row, head) in registers: bound it.
        num_splits = min(num_splits, triton.cdiv(tiles, min_tiles_per_split), max_splits)
    num_splits = max(1, min(num_splits, tiles))
    tiles_per_split = triton.cdiv(tiles, num_splits)
    num_splits = triton.cdiv(tiles, tiles_per_split)
    return LaunchConfig(block_h, block_n, num_warps, num_stages, num_splits, tiles_per_split)


# rows x heads from which the two-phase path is the default. Measured on the H200 (graph replay,
# benchmarks/results/sparse_mla_decode-2026-12-02-h200-two-phase.md): faster at B=16 H=64 (35 vs 55 us),
# B=64 H=16 (47 vs 55 us) and B=64 H=64 (101 vs 165 us); slower at B=16 H=16 and B=4 H=64 (256).
TWO_PHASE_MIN_ROW_HEADS = 1024


def two_phase_config(
    num_heads: int,
    total_tiles: int,
    *,
    block_h: int | None = None,
    block_n: int | None = None,
    block_d: int = 32,
    num_warps: int = 4,
    pv_warps: int = 4,
    pv_block_h: int | None = None,
    num_stages: int = 1,
) -> LaunchConfig:
    """Two-phase path: phase 1 scores BLOCK_H heads x block_n tokens per program (K dequantized
    once per row for up to 64 heads), phase 2 takes block_d output dims of BLOCK_H heads per program
    over the whole row (V dequantized once per row). total_tiles counts tiles of block_n tokens
    (default_config picks both)."""
    if block_h is None:
        block_h = max(16, min(64, triton.next_power_of_2(num_heads)))
    if block_n is None:
        # 64-token tiles at 64 heads; 32 at 16 (64 spilled 4 B in the sm_120 build, same speed).
        block_n = 64 if block_h >= 64 else 32
    if pv_block_h is None:
        # Phase 2 with 64 heads x 32 dims spilled 16 B on sm_120; 32 heads did not, same speed at B=16.
        pv_block_h = 32 if block_h >= 64 else 0
    tiles = max(1, total_tiles)
    return LaunchConfig(
        block_h, block_n, num_warps, num_stages, 1, tiles, True, block_d, pv_warps, pv_block_h
    )


def default_config(rows: int, num_heads: int, topk1: int, topk2: int, sm_count: int) -> LaunchConfig:
    """The configuration a call without `config` gets: two-phase from TWO_PHASE_MIN_ROW_HEADS rows x
    heads, split-KV below (topk2 = 0 without an extra cache)."""
    if rows * num_heads >= TWO_PHASE_MIN_ROW_HEADS:
        block_n = two_phase_config(num_heads, 1).block_n
        return two_phase_config(num_heads, triton.cdiv(topk1, block_n) + triton.cdiv(topk2, block_n))
    return choose_config(rows, num_heads, triton.cdiv(topk1, 16) + triton.cdiv(topk2, 16), sm_count)


def _cache_views(k_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """FP8, uint8 and BF16 views of one paged cache, its page size and its page stride in bytes."""
    if k_cache.ndim != 4 or k_cache.element_size() != 1:
        raise ValueError(
            "k_cache must be SGLang's byte view [num_pages, page_size, 1, 584] (uint8 or float8_e4m3fn), "
            f"got shape {tuple(k_cache.shape)} dtype {k_cache.dtype}"
        )
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    page_bytes = k_cache.stride(0)
    if page_bytes < page_size * (TOKEN_DATA_BYTES + TOKEN_SCALE_BYTES) or page_bytes % 2:
        raise ValueError(f"page stride {page_bytes} B cannot hold {page_size} tokens of 584 B")
    flat = k_cache.as_strided((num_pages * page_bytes,), (1,)).view(torch.uint8)
    return flat.view(torch.float8_e4m3fn), flat, flat.view(torch.bfloat16), page_size, page_bytes


def _flat_indices(indices: torch.Tensor, rows: int) -> torch.Tensor:
    flat = indices.reshape(rows, indices.shape[-1])
    if flat.dtype != torch.int32:
        flat = flat.to(torch.int32)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    return flat


def sparse_mla_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    head_dim_v: int,
    softmax_scale: float | None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    *,
    config: LaunchConfig | None = None,
    dot_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode over SGLang's paged FP8 cache(s); see the module docstring.

    q [B, S_q, H, 512] bf16; indices [B, S_q, topk] int32 (-1 = no token); topk_length [B];
    attn_sink [H] fp32 (natural log); extra_* the compressed cache with its own indices.
    Returns (out [B, S_q, H, 512] bf16, lse [B, H, S_q] fp32).
    """
    if q.ndim != 4 or q.shape[-1] != HEAD_DIM or q.dtype != torch.bfloat16:
        raise ValueError(f"q must be [B, S_q, H, 512] bfloat16, got {tuple(q.shape)} {q.dtype}")
    if head_dim_v != HEAD_DIM:
        raise ValueError(f"head_dim_v must be {HEAD_DIM} (K = V in this MLA), got {head_dim_v}")
    batch, s_q, num_heads, _ = q.shape
    rows = batch * s_q
    if softmax_scale is None:
        softmax_scale = HEAD_DIM**-0.5
    interpret = q.device.type != "cuda"
    if dot_dtype is None:
        # The Triton interpreter multiplies bf16 dot operands wrongly; fp16 is exact there.
        dot_dtype = torch.float16 if interpret else torch.bfloat16
    dot_tl = {torch.float16: tl.float16, torch.float32: tl.float32}.get(dot_dtype, tl.bfloat16)

    q3 = q.reshape(rows, num_heads, HEAD_DIM)
    if q3.stride(-1) != 1:
        q3 = q3.contiguous()
    fp8_1, u8_1, bf16_1, ps1, pb1 = _cache_views(k_cache)
    idx1 = _flat_indices(indices, rows)
    topk1 = idx1.shape[1]
    has_extra = extra_k_cache is not None and extra_indices is not None
    if extra_k_cache is not None and extra_indices is not None:
        fp8_2, u8_2, bf16_2, ps2, pb2 = _cache_views(extra_k_cache)
        idx2 = _flat_indices(extra_indices, rows)
        topk2 = idx2.shape[1]
    else:
        fp8_2, u8_2, bf16_2, ps2, pb2, idx2, topk2 = fp8_1, u8_1, bf16_1, ps1, pb1, idx1, 0

    sm_count = _sm_count(q.device)

    def tiles_of(block_n: int) -> int:
        return int(triton.cdiv(topk1, block_n) + (triton.cdiv(topk2, block_n) if has_extra else 0))

    if config is None:
        config = default_config(rows, num_heads, topk1, topk2 if has_extra else 0, sm_count)
    block_n = config.block_n
    total_tiles = tiles_of(block_n)
    if config.two_phase:
        if config.tiles_per_split < total_tiles:
            raise ValueError(
                f"config covers {config.tiles_per_split} tiles but the call has {total_tiles} tiles of "
                f"{block_n} tokens: build it with two_phase_config(..., total_tiles={total_tiles})"
            )
        two_phase: tuple[torch.Tensor, torch.Tensor] = _two_phase(
            config, q3, idx1, topk1, topk_length, fp8_1, u8_1, bf16_1, ps1, pb1,
            idx2, topk2, extra_topk_length if has_extra else None, fp8_2, u8_2, bf16_2, ps2, pb2,
            has_extra, attn_sink, softmax_scale, dot_tl, interpret, batch, s_q, num_heads,
        )  # fmt: skip
        return two_phase
    if config.num_splits * config.tiles_per_split < total_tiles:
        raise ValueError(
            f"config covers {config.num_splits} x {config.tiles_per_split} tiles but the call has "
            f"{total_tiles} tiles of {block_n} tokens: build it with "
            f"choose_config(..., total_tiles={total_tiles})"
        )
    out = torch.empty(batch, s_q, num_heads, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, num_heads, s_q, dtype=torch.float32, device=q.device)
    out3 = out.view(rows, num_heads, HEAD_DIM)
    final = config.num_splits == 1
    if final:
        mid_o = mid_lse = lse
    else:
        mid_o = torch.empty(
            rows, num_heads, config.num_splits, HEAD_DIM, dtype=torch.float32, device=q.device
        )
        mid_lse = torch.empty(rows, num_heads, config.num_splits, dtype=torch.float32, device=q.device)
    dummy_i32 = idx1
    sink = attn_sink if attn_sink is not None else lse
    grid = (triton.cdiv(num_heads, config.block_h), config.num_splits, rows)
    kwargs = {} if interpret else {"num_warps": config.num_warps, "num_stages": config.num_stages}
    LAST_LAUNCH["split"] = _split_kernel[grid](
        q3, q3.stride(0), q3.stride(1),
        idx1, idx1.stride(0), topk1, topk_length if topk_length is not None else dummy_i32,
        fp8_1, u8_1, bf16_1, ps1, pb1, ps1 * TOKEN_DATA_BYTES,
        idx2, idx2.stride(0), topk2,
        extra_topk_length if (has_extra and extra_topk_length is not None) else dummy_i32,
        fp8_2, u8_2, bf16_2, ps2, pb2, ps2 * TOKEN_DATA_BYTES,
        sink, out3, out3.stride(0), out3.stride(1),
        lse, mid_o, mid_lse,
        num_heads, s_q, config.num_splits, config.tiles_per_split, softmax_scale * LOG2E,
        HAS_LEN1=topk_length is not None,
        HAS_EXTRA=has_extra,
        HAS_LEN2=has_extra and extra_topk_length is not None,
        HAS_SINK=attn_sink is not None,
        FINAL=final,
        BLOCK_H=config.block_h,
        BLOCK_N=config.block_n,
        DOT_DTYPE=dot_tl,
        EMULATE_RNE=interpret,
        **kwargs,
    )  # fmt: skip
    LAST_LAUNCH.pop("combine", None)
    if not final:
        # GPU: 2 heads x 64 dims per program, so that many small programs share the merge; the
        # interpreter pays per program, so there one program takes 16 heads x 512 dims.
        block_hc, block_d = (16, HEAD_DIM) if interpret else (2, 64)
        grid_c = (triton.cdiv(num_heads, block_hc), rows, HEAD_DIM // block_d)
        LAST_LAUNCH["combine"] = _combine_kernel[grid_c](
            mid_o, mid_lse, sink, out3, out3.stride(0), out3.stride(1), lse,
            num_heads, s_q, config.num_splits,
            HAS_SINK=attn_sink is not None,
            BLOCK_S=triton.next_power_of_2(config.num_splits),
            BLOCK_HC=block_hc,
            BLOCK_D=block_d,
            EMULATE_RNE=interpret,
            **({} if interpret else {"num_warps": 2}),
        )  # fmt: skip
    return out, lse


def _two_phase(
    config, q3, idx1, topk1, len1, fp8_1, u8_1, bf16_1, ps1, pb1,
    idx2, topk2, len2, fp8_2, u8_2, bf16_2, ps2, pb2,
    has_extra, attn_sink, softmax_scale, dot_tl, interpret, batch, s_q, num_heads,
):  # fmt: skip
    """Launch the scores kernel and the softmax x V kernel (see two_phase_config)."""
    rows = q3.shape[0]
    device = q3.device
    out = torch.empty(batch, s_q, num_heads, HEAD_DIM, dtype=torch.bfloat16, device=device)
    lse = torch.empty(batch, num_heads, s_q, dtype=torch.float32, device=device)
    out3 = out.view(rows, num_heads, HEAD_DIM)
    bn, bh = config.block_n, config.block_h
    tiles1 = triton.cdiv(topk1, bn)
    tiles2 = triton.cdiv(topk2, bn) if has_extra else 0
    s_cols = (tiles1 + tiles2) * bn
    scores = torch.empty(rows, num_heads, s_cols, dtype=torch.float32, device=device)
    dummy_i32 = idx1
    sink = attn_sink if attn_sink is not None else lse
    len1_arg = len1 if len1 is not None else dummy_i32
    len2_arg = len2 if len2 is not None else dummy_i32
    cache1 = (idx1, idx1.stride(0), topk1, len1_arg, fp8_1, u8_1, bf16_1, ps1, pb1, ps1 * TOKEN_DATA_BYTES)
    cache2 = (idx2, idx2.stride(0), topk2, len2_arg, fp8_2, u8_2, bf16_2, ps2, pb2, ps2 * TOKEN_DATA_BYTES)
    flags = {
        "HAS_LEN1": len1 is not None,
        "HAS_EXTRA": has_extra,
        "HAS_LEN2": has_extra and len2 is not None,
        "BLOCK_H": bh,
        "BLOCK_N": bn,
        "DOT_DTYPE": dot_tl,
    }
    head_blocks = triton.cdiv(num_heads, bh)
    kw1 = {} if interpret else {"num_warps": config.num_warps, "num_stages": config.num_stages}
    LAST_LAUNCH.pop("combine", None)
    LAST_LAUNCH["split"] = _scores_kernel[(tiles1 + tiles2, head_blocks, rows)](
        q3, q3.stride(0), q3.stride(1), *cache1, *cache2,
        scores, num_heads, s_q, s_cols, softmax_scale * LOG2E, **flags, **kw1,
    )  # fmt: skip
    kw2 = {} if interpret else {"num_warps": config.pv_warps, "num_stages": config.num_stages}
    pv_bh = config.pv_block_h or bh
    flags["BLOCK_H"] = pv_bh
    LAST_LAUNCH["combine"] = _pv_kernel[(HEAD_DIM // config.block_d, triton.cdiv(num_heads, pv_bh), rows)](
        *cache1, *cache2, scores, sink, out3, out3.stride(0), out3.stride(1), lse,
        num_heads, s_q, s_cols, **flags,
        HAS_SINK=attn_sink is not None, BLOCK_D=config.block_d, EMULATE_RNE=interpret, **kw2,
    )  # fmt: skip
    return out, lse


def floor_bytes_flops(
    rows: int, num_heads: int, tokens_per_row: int, index_bytes_per_row: int = 0
) -> tuple[int, int]:
    """Fewest bytes one call must move and the FLOPs of its two dots (for benchmark floors)."""
    kv = rows * tokens_per_row * (TOKEN_DATA_BYTES + 7)
    qo = rows * num_heads * (2 * HEAD_DIM * 2 + 4)
    flops = rows * num_heads * tokens_per_row * HEAD_DIM * 4
    return kv + qo + rows * index_bytes_per_row, flops


__all__ = [
    "HEAD_DIM",
    "LAST_LAUNCH",
    "LaunchConfig",
    "choose_config",
    "default_config",
    "floor_bytes_flops",
    "sparse_mla_decode",
    "two_phase_config",
]
