"""The KV rate a deployment needs prefill -> decode, from the model and the target line, by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from fabric_snapshots import CONFIG, LAB_INPUT, LAB_OUTPUT, LAB_TARGETS

from pd_appliance.fabric import kv_need
from pd_appliance.model import ModelConfigError

ROOT = Path(__file__).resolve().parents[2]
# One request's handover per rank, by hand: every prompt token compressed (179.25 bytes on each
# of 21 ratio-4 layers, 6.75 on each of 20 ratio-128 layers = 3899.25) plus the last 128 tokens
# uncompressed on all 43 layers (585 bytes a token: a 149760-byte page of 256).
LAB_REQUEST_BYTES = 1024 * 3899.25 + 128 * 585 * 43  # 7,212,672
LAB_PROMPT_TOK_S = 1000 * 1024 / 128  # 8000: every prompt token's KV crosses once per rank pair
LAB_NEED_GB_S = LAB_PROMPT_TOK_S * LAB_REQUEST_BYTES / 1024 / 1e9  # 0.056349


def test_lab_target_line_needs_0_056_gb_s_per_rank_pair() -> None:
    need = kv_need.need_for_deployment(CONFIG, None, LAB_TARGETS, LAB_INPUT, LAB_OUTPUT)
    assert (need.concurrency, need.target_output_tok_s) == (16, 1000)  # the most demanding entry
    assert need.prompt_tok_s == 8000
    assert need.kv_bytes_per_token == pytest.approx(7043.625)
    assert need.need_gb_s == pytest.approx(LAB_NEED_GB_S) == pytest.approx(0.056349)
    assert need.required_gb_s == pytest.approx(0.56349)  # x 10
    basis = need.basis()
    assert basis.startswith("1000 output tok/s at C=16 x 1024/128 prompt/output tokens = 8000 prompt tok/s")
    assert "x 7043.6 KV bytes/token/rank = 0.05635 GB/s per TP rank pair" in basis
    assert "7212672 bytes per 1024-token prompt per rank" in basis


def test_formula_with_a_given_kv_size() -> None:
    """An explicit size wins over config.json: 10 kB/token at 8000 prompt tok/s is 0.08 GB/s."""
    need = kv_need.need_for_deployment(CONFIG, 10_000, {16: 1000}, 1024, 128, margin=4)
    assert need.need_gb_s == pytest.approx(0.08) and need.required_gb_s == pytest.approx(0.32)
    assert need.source == "appliance_kv_bytes_per_token"
    # Longer prompts at the same output rate move more KV: 8K prompts are 8x the 1K ones.
    longer = kv_need.kv_need(10_000, {16: 1000}, 8192, 128)
    assert longer.need_gb_s == pytest.approx(0.64)


def test_dict_round_trip_keeps_the_figures() -> None:
    need = kv_need.need_for_deployment(CONFIG, None, LAB_TARGETS, LAB_INPUT, LAB_OUTPUT)
    data = need.as_dict()
    assert data["need_gb_s"] == pytest.approx(LAB_NEED_GB_S) and data["basis"] == need.basis()
    assert kv_need.KvNeed.from_dict(data) == need
    assert kv_need.KvNeed.from_dict({"error": "x"}) is None and kv_need.KvNeed.from_dict({}) is None


@pytest.mark.parametrize(
    ("config", "size", "targets", "message"),
    [
        (CONFIG, None, {}, "validation_target_output_tok_s is empty"),
        ({}, None, LAB_TARGETS, "run the checkpoint stage first"),
        (CONFIG, None, {16: 0}, "validation_target_output_tok_s\\[16\\] must be a positive number"),
        ({}, -5, LAB_TARGETS, "appliance_kv_bytes_per_token"),
    ],
)
def test_missing_inputs_name_what_to_set(config: Any, size: Any, targets: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kv_need.need_for_deployment(config, size, targets, LAB_INPUT, LAB_OUTPUT)


def test_another_architecture_is_refused_by_name() -> None:
    with pytest.raises(ModelConfigError, match="DeepseekV4ForCausalLM"):
        kv_need.need_for_deployment({"architectures": ["LlamaForCausalLM"]}, None, LAB_TARGETS, 1024, 128)


def _filters() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location(
        "pd_fabric_filters", ROOT / "plugins" / "filter" / "pd_fabric.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.FilterModule().filters()


def test_filters_give_figures_or_the_reason() -> None:
    f = _filters()
    need = f["pd_kv_need"](CONFIG, None, LAB_TARGETS, LAB_INPUT, LAB_OUTPUT, 10)
    assert need["need_gb_s"] == pytest.approx(LAB_NEED_GB_S)
    assert "run the checkpoint stage first" in f["pd_kv_need"]({}, None, LAB_TARGETS, 1024, 128, 10)["error"]
    topology = {"gpus": [0, 1], "p2p_write": [["X", "OK"], ["CHIPSET_NOT_SUPPORTED", "X"]]}
    assert f["pd_fabric_p2p_ok"](topology, 0, 1) is True
    assert f["pd_fabric_p2p_ok"](topology, 1, 0) is False
    assert f["pd_fabric_p2p_ok"](topology, 1, 1) is True  # one GPU with itself (a one-GPU host)
    assert f["pd_fabric_p2p_ok"]({}, 0, 4) is False  # no facts: judged by the figures
