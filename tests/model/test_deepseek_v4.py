"""pd_appliance.model.deepseek_v4 against figures computed by hand from SGLang 0.5.23's formulas."""

from __future__ import annotations

import json

import pytest

from pd_appliance.model import deepseek_v4 as m
from pd_testlib import DSV4_TEST_CONFIG

# A config with DeepSeek-V4's dims: 2 SWA-only layers, then ratio 4 and 128 alternating (21 + 20).
CONFIG = DSV4_TEST_CONFIG
SHAPE = m.DeepSeekV4Shape.from_config(CONFIG)


def test_v4_layout_pads_pages_to_the_tma_stride() -> None:
    # 256 x 584 = 149504 -> ceil(/576) x 576 = 149760 (REFERENCE.md's page stride); 2 x 584 -> 3 x 576.
    assert m.v4_paged_bytes_per_token(256) == 149760 / 256
    assert m.v4_paged_bytes_per_token(2) == 1728 / 2


def test_bytes_per_token_by_hand() -> None:
    # ratio 4: 585/4 + 132/4 = 179.25 a layer x 21; ratio 128: 864/128 = 6.75 x 20.
    assert m.compressed_bytes_per_token(SHAPE) == pytest.approx(179.25 * 21 + 6.75 * 20)
    # SWA: 585 x 43 + 8/256 x (2*2*512*4 + 2*2*128*4) x 21.
    assert m.swa_bytes_per_token(SHAPE) == pytest.approx(585 * 43 + 8 / 256 * 10240 * 21)
    assert m.bytes_per_full_token(SHAPE) == pytest.approx(0.1 * 31875 + 3899.25)
    # MTP reserves the draft layer: x 44/43, with the c4 ring at 16 rows.
    spec = (0.1 * (585 * 43 + 16 / 256 * 10240 * 21) + 3899.25) * 44 / 43
    assert m.bytes_per_full_token(SHAPE, speculative=True) == pytest.approx(spec)


def test_pool_is_memory_times_fraction_minus_weights() -> None:
    gpu = 96 * m.GIB
    weights = m.weight_bytes_per_rank(149_000_000_000, 4)
    pool = m.kv_pool(SHAPE, gpu_memory_bytes=gpu, mem_fraction_static=0.88, weight_bytes=weights)
    assert pool.available_bytes == int(gpu * 0.88) - 37_250_000_000
    assert pool.max_total_num_tokens == int(pool.available_bytes / 7086.75) // 256 * 256
    assert pool.max_running_requests == 4096  # estimate capped at 4096, far below tokens // 2
    assert pool.requests_that_fit(1152) == 4096


def test_a_small_pool_caps_the_requests_that_fit() -> None:
    weights = int(80.9 * m.GIB)
    pool = m.kv_pool(SHAPE, gpu_memory_bytes=92 * m.GIB, mem_fraction_static=0.88, weight_bytes=weights)
    tokens = int((int(92 * m.GIB * 0.88) - weights) / 7086.75) // 256 * 256
    assert pool.max_total_num_tokens == tokens
    assert 0 < tokens // 1152 < 16  # 64 MB of KV at 7 KB a token: 8960 tokens, 7 requests of 1152
    assert pool.requests_that_fit(1152) == tokens // 1152


def test_no_room_for_the_cache_is_sglangs_error() -> None:
    with pytest.raises(ValueError, match="increase --mem-fraction-static"):
        m.kv_pool(SHAPE, gpu_memory_bytes=96 * m.GIB, mem_fraction_static=0.5, weight_bytes=60 * m.GIB)


def test_transfer_is_compressed_prompt_plus_the_window() -> None:
    assert m.kv_transfer_bytes(SHAPE, 1024) == pytest.approx(1024 * 3899.25 + 128 * 585 * 43)
    assert m.kv_transfer_bytes(SHAPE, 64) == pytest.approx(64 * 3899.25 + 64 * 585 * 43)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "not \\['DeepseekV4ForCausalLM'\\]"),
        ({"window_size": 0}, "window_size must be a positive integer"),
        ({"compress_ratios": [4] * 10}, "one ratio per layer \\(43\\)"),
        ({"compress_ratios": [3] * 43}, "has \\[3\\]"),
    ],
)
def test_bad_config_names_the_field(change: dict, message: str) -> None:
    with pytest.raises(m.ModelConfigError, match=message):
        m.DeepSeekV4Shape.from_config({**CONFIG, **change})


def test_load_shape_reads_the_checkpoint_dir(tmp_path) -> None:
    with pytest.raises(m.ModelConfigError, match="does not exist"):
        m.load_shape(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert m.load_shape(tmp_path) == SHAPE


def test_missing_fields_take_sglangs_config_defaults() -> None:
    """DeepSeekV4Config's dataclass defaults fill what config.json leaves out (the real checkpoint
    names its window sliding_window); the layer count has no default."""
    sparse = {
        k: v for k, v in CONFIG.items() if k not in ("window_size", "qk_nope_head_dim", "index_head_dim")
    }
    assert m.DeepSeekV4Shape.from_config(sparse) == SHAPE
    with pytest.raises(m.ModelConfigError, match="num_hidden_layers must be a positive integer, got None"):
        m.DeepSeekV4Shape.from_config({k: v for k, v in CONFIG.items() if k != "num_hidden_layers"})


def test_the_rehearsal_checkpoint_has_the_shape_the_model_sizes() -> None:
    """The Hub stand-in serves the real checkpoint's config.json shape: the pool and the fabric
    figure are computed from it, not skipped."""
    from pd_standins.hub import real_checkpoint_config

    shape = m.DeepSeekV4Shape.from_config(real_checkpoint_config())
    assert shape.num_hidden_layers == 43 and shape.layers_with_ratio(4) + shape.layers_with_ratio(128) == 41
    assert 5000 < m.bytes_per_full_token(shape) < 10000
