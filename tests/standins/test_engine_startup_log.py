"""The rehearsal engine prints SGLang 0.5.23's start-up lines, and they parse to what its flags imply."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pd_appliance.serving import startup_log as parser
from pd_standins.engine import cli
from pd_standins.engine import startup_log as engine
from pd_testlib import FAST_ENGINE_START, reserve_ports

# The real checkpoint's shape for what SGLang decides on (srt/configs/model_config.py: quant_algo
# MIXED_PRECISION + moe_quant_algo NVFP4 + group_size make it a hybrid FP8+NVFP4 checkpoint).
QUANT = {
    "quant_method": "modelopt",
    "quant_algo": "MIXED_PRECISION",
    "moe_quant_algo": "NVFP4",
    "group_size": 16,
}
HYBRID = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "quantization_config": {**QUANT, "ignore": ["lm_head", "model.layers.0.attn"]},
}
PD = ["--tp-size", "4", "--disaggregation-transfer-backend", "nixl", "--kv-cache-dtype", "fp8_e4m3"]
MTP = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
       "--speculative-num-draft-tokens", "4"]  # fmt: skip
# srt/arg_groups/cuda_graph_hook.py generate_decode_cuda_graph_batch_sizes, max_bs 32.
SPEC_BS_32 = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32]
PLAIN_BS_32 = [1, 2, 4, 8, 12, 16, 24, 32]


def model(tmp_path: Path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def record(argv: list[str], environ: dict[str, str] | None = None) -> dict:
    config, _ignored = cli.config_from_args(argv)
    out = io.StringIO()
    engine.emit(argv, config, cli.load_flag_table(), stream=out, environ=environ or {})
    return parser.extract(parser.log_lines(out.getvalue().splitlines()))


def test_a_decode_with_mtp_logs_the_verify_graphs_and_the_sm100_only_draft_moe(tmp_path: Path) -> None:
    argv = ["--model-path", model(tmp_path, HYBRID), "--disaggregation-mode", "decode", *PD, *MTP,
            "--moe-runner-backend", "flashinfer_cutlass", "--cuda-graph-max-bs-decode", "32"]  # fmt: skip
    rec = record(argv, {"SGLANG_DISAGGREGATION_NIXL_BACKEND": "UCX"})
    choices = rec["choices"]
    assert (choices["attention_backend"], choices["attention_impl"]) == ("dsv4", "DeepseekV4AttnBackend")
    assert choices["moe_runner_backend"] == "flashinfer_cutlass"
    assert choices["kv_cache_dtype"] == "fp8_e4m3"
    assert choices["nvfp4_moe"] == {"group_size": 16, "exclude_modules": 2}
    assert choices["cuda_graph_capture"] == "target verify" and choices["cuda_graph_bs"] == SPEC_BS_32
    assert choices["speculative"]["verify_tokens_per_req"] == 4
    assert (choices["transfer_backend"], choices["nixl_backend"]) == ("nixl", "UCX")
    (fallback,) = rec["fallbacks"]
    assert fallback["name"].startswith("SM100-only") and "model.decoder.mlp.experts" in fallback["line"]


def test_without_mtp_nothing_falls_back_and_the_plain_decode_sizes_are_captured(tmp_path: Path) -> None:
    argv = ["--model-path", model(tmp_path, HYBRID), "--disaggregation-mode", "decode", *PD,
            "--moe-runner-backend", "flashinfer_cutlass", "--cuda-graph-max-bs-decode", "32"]  # fmt: skip
    rec = record(argv)
    assert rec["fallbacks"] == []
    assert rec["choices"]["cuda_graph_capture"] == "target decode"
    assert rec["choices"]["cuda_graph_bs"] == PLAIN_BS_32
    assert "speculative" not in rec["choices"]


def test_auto_settings_resolve_as_sglang_resolves_them_for_deepseek_v4(tmp_path: Path) -> None:
    argv = ["--model-path", model(tmp_path, HYBRID), "--disaggregation-mode", "decode", "--tp-size", "4",
            "--max-running-requests", "48"]  # fmt: skip
    choices = record(argv)["choices"]
    assert choices["moe_runner_backend"] == "flashinfer_trtllm_routed"  # model_overrides/deepseek_v4.py
    assert choices["kv_cache_dtype"] == "fp8_e4m3"  # overrides.py _deepseek_v4_kv_cache_dtype
    # memory_hook.py: 96 GB at TP4 gives max_bs 512, capped at an explicit --max-running-requests.
    assert choices["cuda_graph_bs"] == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]
    assert choices["max_running_requests"] == 48


def test_the_request_pool_bounds_the_captured_sizes(tmp_path: Path) -> None:
    argv = ["--model-path", model(tmp_path, HYBRID), "--disaggregation-mode", "decode", "--tp-size", "4",
            "--cuda-graph-max-bs-decode", "64", "--max-running-requests", "20"]  # fmt: skip
    # base_cuda_graph_runner.py get_batch_sizes_to_capture: sizes above the pool go, the pool size is added.
    assert record(argv)["choices"]["cuda_graph_bs"] == [1, 2, 4, 8, 12, 16, 20]


def test_a_prefill_captures_no_decode_graph(tmp_path: Path) -> None:
    argv = ["--model-path", model(tmp_path, HYBRID), "--disaggregation-mode", "prefill", *PD]
    choices = record(argv)["choices"]
    assert "cuda_graph_bs" not in choices
    assert choices["cuda_graph_decode_config"]["backend"] == "disabled"


@pytest.mark.timeout(120)
def test_the_engine_process_writes_the_lines_in_sglangs_logger_format(tmp_path: Path) -> None:
    (port,) = reserve_ports(1)
    argv = ["--model-path", model(tmp_path, HYBRID), "--disaggregation-mode", "decode", *PD,
            "--moe-runner-backend", "flashinfer_cutlass", "--port", str(port),
            "--api-key", "sekrit-key"]  # fmt: skip
    log = tmp_path / "decode.log"
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pd_standins.engine.cli", *argv],
            stdout=handle,
            stderr=handle,
            env={**os.environ, **FAST_ENGINE_START},
        )
    try:
        deadline = time.monotonic() + 60
        while "max_total_num_tokens=" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert "sekrit-key" not in text
    rec = parser.parse_log(log)
    assert rec["engine_lines"] > 10 and rec["fallbacks"] == []
    assert rec["choices"]["attention_impl"] == "DeepseekV4AttnBackend"
    assert rec["choices"]["max_running_requests"] == 256


def test_the_server_args_line_redacts_the_api_key_as_patch_0003_does(tmp_path: Path) -> None:
    argv = ["--model-path", model(tmp_path, HYBRID), "--disaggregation-mode", "decode", *PD,
            "--api-key", "router-secret-key"]  # fmt: skip
    config, _ignored = cli.config_from_args(argv)
    out = io.StringIO()
    engine.emit(argv, config, cli.load_flag_table(), stream=out, environ={})
    text = out.getvalue()
    assert "router-secret-key" not in text
    assert "'api_key': '<redacted>'" in text
