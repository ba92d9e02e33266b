"""pd_appliance.bench.roofline against figures computed by hand (the arithmetic is in each test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pd_appliance.bench import roofline
from pd_appliance.checkpoint.safetensors_format import read_safetensors_summary

# Two MoE layers of four experts, two chosen a token; 100 bytes an expert.
TINY_CONFIG = {
    "num_hidden_layers": 2,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 0,
}
TINY_TENSORS = {
    **{f"model.layers.{layer}.mlp.experts.{e}.w": 100 for layer in (0, 1) for e in range(4)},
    "model.layers.0.self_attn.q.weight": 50,
    "model.layers.1.self_attn.q.weight": 50,
    "lm_head.weight": 200,
    # Not read by a plain decode step: the embedding (one row a token), the MTP layer by either name.
    "model.embed_tokens.weight": 300,
    "mtp.0.mlp.experts.0.w": 1000,
    "model.layers.2.mlp.experts.0.w": 1000,
}


def tiny_groups() -> roofline.WeightGroups:
    return roofline.groups_from_tensors(TINY_TENSORS, TINY_CONFIG)


def test_tensor_groups_leave_out_the_embedding_and_mtp() -> None:
    groups = tiny_groups()
    # dense = 50 + 50 + 200; routed = 8 experts x 100 bytes.
    assert groups.dense_bytes == 300
    assert groups.routed_expert_bytes == 100
    assert (groups.moe_layers, groups.experts, groups.experts_per_token) == (2, 4, 2)


def test_experts_touched_by_a_batch() -> None:
    # One token touches exactly its k experts; two tokens over 4 experts with k=2: 4 x (1 - (1/2)^2) = 3.
    assert roofline.experts_touched(256, 6, 1) == pytest.approx(6.0)
    assert roofline.experts_touched(4, 2, 2) == pytest.approx(3.0)
    # 16 tokens over 256 experts, 6 each: 256 x (1 - (250/256)^16) = 256 x (1 - 0.684217) = 80.84.
    assert roofline.experts_touched(256, 6, 16) == pytest.approx(80.84, abs=0.01)
    assert roofline.experts_touched(256, 6, 0) == 0.0


def test_step_bytes_and_limits() -> None:
    groups = tiny_groups()
    # TP2, one sequence with 10 KV bytes: (300 + 2 layers x 2 experts x 100) / 2 + 10 = 360 bytes.
    assert roofline.step_bytes_per_gpu(groups, tp=2, batch=1, kv_bytes_per_sequence=10) == pytest.approx(360)
    # At 3600 B/s: 1 token per 360 bytes = 10 tok/s.
    assert roofline.instance_limit_tok_s(groups, 2, 1, 3600, 10) == pytest.approx(10.0)
    # Two sequences: 3 experts touched a layer -> (300 + 600) / 2 + 20 = 470 bytes for 2 tokens:
    # 2 x 3600 / 470 = 15.319 tok/s.
    assert roofline.instance_limit_tok_s(groups, 2, 2, 3600, 10) == pytest.approx(15.319, abs=0.001)
    # Two TP2 decodes at C=3: one holds 2 sequences, the other 1: 15.319 + 10.
    assert roofline.layout_limit_tok_s(groups, [2, 2], 3, 3600, 10) == pytest.approx(25.319, abs=0.001)


def test_nvml_bandwidth() -> None:
    # RTX PRO 6000 Blackwell: 512-bit GDDR7 at 28 Gb/s (NVIDIA's datasheet: 1792 GB/s); NVML would
    # give the clock as 14000 MHz: 2 x 14000e6 x 512 / 8 = 1.792e12.
    assert roofline.nvml_bandwidth_bytes_s(512, 14000) == pytest.approx(1.792e12)
    with pytest.raises(roofline.RooflineError, match="validation_gpu_memory_bandwidth_gb_s"):
        roofline.nvml_bandwidth_bytes_s(0, 14000)


def test_the_worked_example_of_docs_roofline() -> None:
    """docs/roofline.md: DeepSeek-V4-Flash NVFP4, TP4 decode on RTX PRO 6000 (1792 GB/s)."""
    data = Path(__file__).resolve().parents[2] / "standins/src/pd_standins/data/deepseek_v4_flash_nvfp4.json"
    config = json.loads(data.read_text())["config"]
    groups = roofline.groups_from_config(config, dense_bytes=12_000_000_000)
    # One expert: 3 x 4096 x 2048 weights x 0.5625 bytes = 14,155,776 bytes.
    assert groups.routed_expert_bytes == pytest.approx(14_155_776)
    # bs=1: 12e9 + 43 layers x 6 experts x 14,155,776 = 12e9 + 3.6522e9 = 15.652e9 bytes over 4 GPUs
    # = 3.913e9 a GPU (KV aside): 1.792e12 / 3.913e9 = 458 tok/s.
    limit = roofline.instance_limit_tok_s(groups, 4, 1, 1.792e12, 0)
    assert limit == pytest.approx(458.0, rel=0.002)


def test_the_rehearsal_checkpoint_tensors(tmp_path: Path) -> None:
    """The stand-in checkpoint's own shards: 2 layers of 4 experts, hidden 256, expert width 128."""
    from pd_standins import hub

    files = hub.rehearsal_checkpoint_files()
    tensor_bytes: dict[str, int] = {}
    for name, content in files.items():
        if name.endswith(".safetensors"):
            (tmp_path / name).write_bytes(content)
            tensor_bytes |= read_safetensors_summary(tmp_path / name).tensor_bytes
    config = json.loads(files["config.json"])
    groups = roofline.groups_from_tensors(tensor_bytes, config)
    # An expert: gate and up 128x256, down 256x128, each FP4 (16384 bytes) + FP8 scales (2048) + F32 (4).
    assert groups.routed_expert_bytes == 3 * (16384 + 2048 + 4)
    assert groups.moe_layers == 2
    # Dense: 2 layers x (norm 512 + q_proj 256x256x2) + final norm 512 + the LM head (vocab x 256 x 2).
    assert groups.dense_bytes == 2 * (512 + 131072) + 512 + config["vocab_size"] * 256 * 2


def test_a_config_without_experts_is_refused() -> None:
    with pytest.raises(roofline.RooflineError, match="n_routed_experts"):
        roofline.groups_from_config({"num_hidden_layers": 2}, dense_bytes=1)
    with pytest.raises(roofline.RooflineError, match="no routed-expert tensor"):
        roofline.groups_from_tensors({"lm_head.weight": 10}, TINY_CONFIG)


def _rehearsal_checkpoint(directory: Path) -> None:
    from pd_standins import hub

    for name, content in hub.rehearsal_checkpoint_files().items():
        (directory / name).write_bytes(content)


ENGINE_STARTUP = {
    "gpu-node-01": {
        "prefill": {
            "choices": {"disaggregation_mode": "prefill"},
            "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        },
        "decode": {"choices": {"disaggregation_mode": "decode"}, "env": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}},
    }
}
RTX_PRO_6000 = {"memory_bus_width_bits": 512, "memory_clock_max_mhz": 14000}
MEASUREMENT = {
    "variant": "deployed",
    "phases": [{"concurrency": 1, "output_tok_s": 90.0}, {"concurrency": 16, "output_tok_s": 1300.0}],
}


def test_the_report_section_of_a_pd_layout(tmp_path: Path) -> None:
    _rehearsal_checkpoint(tmp_path)
    section = roofline.report_section(MEASUREMENT, ENGINE_STARTUP, [RTX_PRO_6000] * 8, tmp_path, 1280)
    assert "error" not in section, section
    # Only the decode counts, with its four GPUs; the bandwidth is NVML's 1,792 GB/s.
    assert section["decode_tp_sizes"] == [4]
    assert section["bandwidth_gb_s"] == pytest.approx(1792.0)
    config = json.loads((tmp_path / "config.json").read_text())
    groups = roofline.checkpoint_groups(roofline.checkpoint_shards(tmp_path), config)
    kv = roofline.kv_bytes_per_token(config) * 1280
    for label, concurrency, measured in (("bs=1", 1, 90.0), ("C=16", 16, 1300.0)):
        level = section["levels"][label]
        assert level["limit_tok_s"] == pytest.approx(
            roofline.instance_limit_tok_s(groups, 4, concurrency, 1.792e12, kv)
        )
        assert level["efficiency"] == pytest.approx(measured / level["limit_tok_s"])
    assert "stand_in" not in section
    lines = roofline.markdown(section)
    assert lines[1].startswith("## Roofline")
    assert any(line.startswith("| C=16 | 1300.0 |") for line in lines)


def test_the_report_section_says_what_is_missing(tmp_path: Path) -> None:
    # No checkpoint yet: the section says so, the report is still written.
    section = roofline.report_section(MEASUREMENT, ENGINE_STARTUP, [RTX_PRO_6000], tmp_path, 1280)
    assert "no *.safetensors" in section["error"]
    _rehearsal_checkpoint(tmp_path)
    # GPUs whose NVML has no bus width: the fix is the override, which then wins.
    section = roofline.report_section(MEASUREMENT, ENGINE_STARTUP, [{"name": "x"}], tmp_path, 1280)
    assert "validation_gpu_memory_bandwidth_gb_s" in section["error"]
    section = roofline.report_section(MEASUREMENT, ENGINE_STARTUP, [{"name": "x"}], tmp_path, 1280, 1000.0)
    assert section["bandwidth_gb_s"] == pytest.approx(1000.0)
    assert section["bandwidth_source"] == "validation_gpu_memory_bandwidth_gb_s"
    assert roofline.markdown({"error": "why"})[-1] == "Not computed: why"


def test_simulated_gpus_are_named_in_the_section(tmp_path: Path) -> None:
    _rehearsal_checkpoint(tmp_path)
    gpus = [{**RTX_PRO_6000, "stand_in": "simulated GPU (a test)"}]
    section = roofline.report_section(MEASUREMENT, ENGINE_STARTUP, gpus, tmp_path, 1280)
    assert section["stand_in"].startswith("STAND-IN")
    assert f"{section['stand_in']}." in roofline.markdown(section)
