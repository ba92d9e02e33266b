"""Correctness of the split-KV sparse-MLA decode against a float64 reference on the same cache bytes.

On a CPU these run under the Triton interpreter at small shapes (fp16 dot operands, since the
interpreter gets bf16 dots wrong); with a CUDA GPU the same tests run the real bf16 path, and the
gpu-marked ones add SGLang's shapes, CUDA-graph replay and the compiled kernels' resources.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from pd_kernels import sparse_mla_decode as smd  # noqa: E402
from pd_kernels.reference import (  # noqa: E402
    random_cache,
    random_indices,
    reference_decode,
    relative_error,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
MAX_REL_ERR = 5e-3
SCALE = 512**-0.5


def _case(seed: int, batch: int, heads: int, *, extra: bool, sink: bool, page: int, topk1: int, topk2: int):
    """Fresh random inputs: -1 indices, topk_length shorter than top-k, and a last row with nothing valid."""
    g = torch.Generator().manual_seed(seed)
    pages1, pages2 = 3, 3
    c1 = random_cache(pages1, page, generator=g, device=DEVICE)
    c2 = random_cache(pages2, page // 2, generator=g, device=DEVICE)
    q = torch.randn(batch, 1, heads, 512, generator=g).to(torch.bfloat16).to(DEVICE)
    i1 = random_indices(batch, topk1, pages1 * page, invalid_fraction=0.2, generator=g, device=DEVICE)
    len1 = torch.randint(1, topk1, (batch,), generator=g, dtype=torch.int32)
    len1[-1] = 0
    kw = {
        "q": q,
        "k_cache": c1,
        "indices": i1,
        "topk_length": len1.to(DEVICE),
        "attn_sink": (torch.randn(heads, generator=g) * 2).to(DEVICE) if sink else None,
    }
    if extra:
        i2 = random_indices(
            batch, topk2, pages2 * page // 2, invalid_fraction=0.1, generator=g, device=DEVICE
        )
        i2[-1] = -1
        len2 = torch.randint(1, topk2 + 1, (batch,), generator=g, dtype=torch.int32)
        kw |= {"extra_k_cache": c2, "extra_indices": i2, "extra_topk_length": len2.to(DEVICE)}
    return kw


def _run(kw, **extra):
    return smd.sparse_mla_decode(
        kw["q"], kw["k_cache"], kw["indices"], kw["topk_length"], kw["attn_sink"], 512, SCALE,
        kw.get("extra_k_cache"), kw.get("extra_indices"), kw.get("extra_topk_length"), **extra,
    )  # fmt: skip


def _reference(kw):
    return reference_decode(
        kw["q"], kw["k_cache"], kw["indices"], kw["topk_length"], kw["attn_sink"], SCALE,
        kw.get("extra_k_cache"), kw.get("extra_indices"), kw.get("extra_topk_length"),
    )  # fmt: skip


def _check(out, lse, ref_out, ref_lse):
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    assert torch.isfinite(out).all()
    err = relative_error(out, ref_out)
    assert err <= MAX_REL_ERR, f"relative error {err:.2e} > {MAX_REL_ERR}"
    lse, ref_lse = lse.double().cpu(), ref_lse
    empty = ref_lse == float("-inf")
    assert torch.equal(lse == float("-inf"), empty)
    assert torch.allclose(lse[~empty], ref_lse[~empty], atol=1e-4, rtol=1e-5)
    return err, empty


@pytest.mark.parametrize("splits", [None, 1], ids=["split-kv", "one-split"])
@pytest.mark.parametrize("sink", [False, True], ids=["no-sink", "sink"])
@pytest.mark.parametrize("extra", [False, True], ids=["swa", "swa+extra"])
def test_matches_float64_reference(extra: bool, sink: bool, splits: int | None) -> None:
    kw = _case(7 + 2 * extra + sink, batch=2, heads=20, extra=extra, sink=sink, page=64, topk1=40, topk2=72)
    config = None
    if splits is not None:
        tiles = -(-40 // 16) + (-(-72 // 16) if extra else 0)
        config = smd.choose_config(2, 20, tiles, 8, num_splits=splits)
    out, lse = _run(kw, config=config)
    _, empty = _check(out, lse, *_reference(kw))
    # The last row has no valid token: zero output and -inf LSE, with or without the sink.
    assert empty[-1].all()
    assert (out[-1].float() == 0).all()


@pytest.mark.parametrize(
    ("extra", "sink", "block_d"), [(False, False, 64), (True, True, 32)], ids=["swa", "swa+extra+sink"]
)
def test_two_phase_matches_float64_reference(extra: bool, sink: bool, block_d: int) -> None:
    """The large-batch path (scores kernel, then softmax x V per block_d dims) on the same cases."""
    kw = _case(31 + extra, batch=2, heads=20, extra=extra, sink=sink, page=64, topk1=40, topk2=72)
    tiles = -(-40 // 32) + (-(-72 // 32) if extra else 0)
    config = smd.two_phase_config(20, tiles, block_n=32, block_d=block_d)
    out, lse = _run(kw, config=config)
    _, empty = _check(out, lse, *_reference(kw))
    assert empty[-1].all()
    assert (out[-1].float() == 0).all()


def test_multiple_queries_per_row_and_uint8_cache_view() -> None:
    g = torch.Generator().manual_seed(3)
    cache = random_cache(2, 64, generator=g, device=DEVICE)
    q = torch.randn(1, 2, 16, 512, generator=g).to(torch.bfloat16).to(DEVICE)
    idx = torch.cat([random_indices(1, 32, 128, invalid_fraction=0.3, generator=g) for _ in range(2)], 1)
    idx = idx.to(DEVICE)
    out, lse = smd.sparse_mla_decode(q, cache, idx, None, None, 512, SCALE)
    _check(out, lse, *reference_decode(q, cache, idx, None, None, SCALE))
    out_u8, lse_u8 = smd.sparse_mla_decode(q, cache.view(torch.uint8), idx, None, None, 512, SCALE)
    assert torch.equal(out_u8, out) and torch.equal(lse_u8, lse)


def test_bad_inputs_name_the_fix() -> None:
    g = torch.Generator().manual_seed(5)
    cache = random_cache(1, 64, generator=g, device=DEVICE)
    q = torch.randn(1, 1, 16, 512, generator=g).to(DEVICE)
    idx = random_indices(1, 16, 64, generator=g, device=DEVICE)
    with pytest.raises(ValueError, match="bfloat16"):
        smd.sparse_mla_decode(q, cache, idx, None, None, 512, SCALE)
    with pytest.raises(ValueError, match="head_dim_v"):
        smd.sparse_mla_decode(q.bfloat16(), cache, idx, None, None, 448, SCALE)
    with pytest.raises(ValueError, match="584"):
        smd.sparse_mla_decode(q.bfloat16(), cache.view(torch.bfloat16), idx, None, None, 512, SCALE)
    small = smd.choose_config(1, 16, 0, 8, num_splits=1)
    with pytest.raises(ValueError, match="choose_config"):
        smd.sparse_mla_decode(q.bfloat16(), cache, idx.repeat(1, 1, 4), None, None, 512, SCALE, config=small)


def test_split_count_fills_the_gpu_and_covers_every_tile() -> None:
    for rows, heads, tiles in [(1, 64, 40), (16, 64, 40), (64, 64, 40), (4, 16, 40), (1, 16, 1)]:
        cfg = smd.choose_config(rows, heads, tiles, 132)
        assert cfg.num_splits * cfg.tiles_per_split >= tiles
        assert (cfg.num_splits - 1) * cfg.tiles_per_split < tiles  # no split left without work
    assert smd.choose_config(1, 64, 40, 132).num_splits == 40  # 160 programs of 1 tile for one row
    assert smd.choose_config(64, 64, 40, 132).num_splits == 2
    assert smd.choose_config(1, 16, 400, 188).num_splits <= 64  # the merge stays bounded for a long top-k


def test_default_path_by_shape() -> None:
    """Split-KV below TWO_PHASE_MIN_ROW_HEADS rows x heads (B=1..4, B=16 at 16 heads), two-phase above."""
    assert not smd.default_config(1, 64, 128, 512, 132).two_phase
    assert not smd.default_config(16, 16, 128, 512, 132).two_phase
    big = smd.default_config(16, 64, 128, 512, 132)
    assert big.two_phase and (big.block_h, big.block_n, big.block_d, big.pv_block_h) == (64, 64, 32, 32)
    assert big.tiles_per_split == 10
    small_heads = smd.default_config(64, 16, 128, 512, 132)
    assert small_heads.two_phase and (small_heads.block_n, small_heads.tiles_per_split) == (32, 20)


@pytest.mark.slow
def test_sm120_budget_from_compiled_kernel() -> None:
    """Every kernel variant compiled for sm_120 (no GPU needed): <= 99 KB shared per program, no spills."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "pd_kernels.resources", "--arch", "120"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["kernel"] for r in reports] == [
        "split",
        "split_final",
        "scores_h64",
        "pv_h64",
        "scores_h16",
        "pv_h16",
    ]
    for r in reports:
        assert r["shared_bytes"] <= 99 * 1024, r
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0 and r["stack_frame_bytes"] == 0, r


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("heads", [16, 64])
@pytest.mark.parametrize("batch", [1, 4, 16, 64])
def test_sglang_shapes_on_gpu(batch: int, heads: int) -> None:
    """SWA top-k 128 + compressed top-k 512 on 256-token pages, as DeepSeek-V4 decode calls it."""
    g = torch.Generator().manual_seed(100 + batch + heads)
    c1 = random_cache(64, 256, generator=g, device="cuda")
    c2 = random_cache(32, 256, generator=g, device="cuda")
    q = torch.randn(batch, 1, heads, 512, generator=g).to(torch.bfloat16).cuda()
    i1 = random_indices(batch, 128, 64 * 256, invalid_fraction=0.05, generator=g, device="cuda")
    i2 = random_indices(batch, 512, 32 * 256, invalid_fraction=0.05, generator=g, device="cuda")
    len2 = torch.randint(100, 513, (batch,), generator=g, dtype=torch.int32).cuda()
    sink = torch.randn(heads, generator=g).cuda()
    args = (q, c1, i1, None, sink, 512, SCALE, c2, i2, len2)
    out, lse = smd.sparse_mla_decode(*args)
    _check(out, lse, *reference_decode(q, c1, i1, None, sink, SCALE, c2, i2, len2))
    for name, kernel in smd.LAST_LAUNCH.items():
        assert kernel.metadata.shared <= 99 * 1024, (name, kernel.metadata.shared)
        assert kernel.n_spills == 0, (name, kernel.n_spills)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graph_replay_follows_new_inputs() -> None:
    g = torch.Generator().manual_seed(11)
    c1 = random_cache(16, 256, generator=g, device="cuda")
    q = torch.randn(4, 1, 16, 512, generator=g).to(torch.bfloat16).cuda()
    idx = random_indices(4, 128, 16 * 256, invalid_fraction=0.1, generator=g, device="cuda")
    length = torch.full((4,), 128, dtype=torch.int32, device="cuda")
    smd.sparse_mla_decode(q, c1, idx, length, None, 512, SCALE)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = smd.sparse_mla_decode(q, c1, idx, length, None, 512, SCALE)
    q.copy_(torch.randn(4, 1, 16, 512, generator=g).to(torch.bfloat16))
    idx.copy_(random_indices(4, 128, 16 * 256, invalid_fraction=0.1, generator=g))
    length.copy_(torch.tensor([128, 64, 1, 0], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    _check(out, lse, *reference_decode(q, c1, idx, length, None, SCALE))
