"""What SGLang chose at start-up, read from its log lines (built from the wheel's format strings)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pd_appliance.serving import startup_log
from startup_log_lines import line, message

MTP, MOE = "serving_speculative_algorithm", "--moe-runner-backend"
DECODE_BS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32]
SERVER_ARGS = {
    "model_path": "/m",
    "tp_size": 4,
    "api_key": "sekrit-key",
    "disaggregation_mode": "decode",
    "disaggregation_transfer_backend": "nixl",
    "attention_backend": "dsv4",
    "prefill_attention_backend": None,
    "moe_runner_backend": "flashinfer_cutlass",
    "kv_cache_dtype": "fp8_e4m3",
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "cuda_graph_config": {
        "decode": {"backend": "full", "max_bs": 32, "bs": DECODE_BS, "tc_compiler": "eager"}
    },
}


def decode_log(ts: str = "2026-12-03 10:00:00", **server_args: object) -> list[str]:
    """A decode worker's start-up, in SGLang 0.5.23's words and logger format."""
    record = {**SERVER_ARGS, **server_args}
    return [
        "pd-launch: starting",
        line(message("dsv4_attention", model_arch="DeepseekV4ForCausalLM", page_size=256), ts=ts),
        line(message("hybrid", group_size=16, excluded=7), ts=ts),
        line(message("server_args", record=record), ts=ts),
        line(message("nvfp4"), " TP0", ts),
        line(
            message(
                "load_weight",
                elapsed=41.5,
                model_class="DeepseekV4ForCausalLM",
                quant_str="quant=modelopt, quant_algo=MIXED_PRECISION",
                avail=60.1,
                usage=35.2,
            ),
            " TP0",
            ts,
        ),
        line(message("attention_impl", cls="DeepseekV4AttnBackend"), " TP0", ts),
        f"{ts} NIXL INFO    _api.py:405 Backend UCX was instantiated",
        line(message("nixl_kv_manager", backend="UCX"), " TP0", ts),
        line(
            message(
                "capture_begin",
                capture_name="target verify",
                backend="full",
                num_tokens_per_req=4,
                avail=20.0,
            ),
            " TP0",
            ts,
        ),
        line(
            message(
                "capture_end", capture_name="target verify", bs=DECODE_BS, elapsed=3.2, usage=1.1, avail=18.9
            ),
            " TP0",
            ts,
        ),
        line(message("draft_decode", backend="full", topk=1, bs=DECODE_BS, avail=18.9), " TP0", ts),
        line(
            message("scheduler", tokens=500000, chunk=8192, prefill=16384, mrr=256, ctx=65536, avail=18.0),
            " TP0",
            ts,
        ),
    ]


def test_the_choices_come_from_the_engines_own_lines() -> None:
    record = startup_log.extract(startup_log.log_lines(decode_log()))
    choices = record["choices"]
    assert choices["attention_backend"] == "dsv4"
    assert choices["attention_impl"] == "DeepseekV4AttnBackend"
    assert choices["page_size"] == 256
    assert choices["moe_runner_backend"] == "flashinfer_cutlass"
    assert choices["quant"] == "quant=modelopt, quant_algo=MIXED_PRECISION"
    assert choices["nvfp4_moe"] == {"group_size": 16, "exclude_modules": 7}
    assert choices["kv_cache_dtype"] == "fp8_e4m3"
    assert choices["cuda_graph_bs"] == DECODE_BS
    assert choices["cuda_graph_capture"] == "target verify"
    assert choices["draft_cuda_graph_bs"] == {"decode": DECODE_BS}
    spec = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    assert choices["speculative"] == {**spec, "verify_tokens_per_req": 4}
    assert choices["max_running_requests"] == 256
    assert (choices["transfer_backend"], choices["nixl_backend"], choices["nixl_plugin"]) == (
        "nixl",
        "UCX",
        "UCX",
    )
    assert record["fallbacks"] == []
    assert record["evidence"]["cuda_graph"].startswith(
        "[2026-12-03 10:00:00 TP0] Capture target verify CUDA graph end."
    )


def test_the_api_key_in_server_args_never_reaches_the_record() -> None:
    record = startup_log.extract(startup_log.log_lines(decode_log()))
    assert "sekrit-key" not in json.dumps(record)


@pytest.mark.parametrize(
    ("msg", "name", "flag"),
    [
        (message("fallback_trtllm_mxfp4", prefix="model.decoder.mlp.experts"), "SM100-only", MTP),
        (message("fallback_fp8_moe", backend="FLASHINFER_CUTLASS"), "Triton fused-MoE", MOE),
        (message("fallback_marlin_mxfp4", prefix="model.layers.3.mlp.experts"), "Marlin", MOE),
        (message("fallback_nixl_strided"), "fallback named in the log", "the setting the line names"),
    ],
)
def test_a_fallback_in_the_log_is_named_with_its_line_and_flag(msg: str, name: str, flag: str) -> None:
    lines = [*decode_log(), line(msg, " TP0"), line(msg, " TP1")]
    (fallback,) = startup_log.extract(startup_log.log_lines(lines))["fallbacks"]
    assert name in fallback["name"] and flag in fallback["flag"]
    assert fallback["line"] == line(msg, " TP0")
    assert fallback["count"] == 2  # the same message from two TP ranks: one entry, counted


def test_a_fallback_backend_resolved_in_server_args_is_named() -> None:
    lines = decode_log(moe_runner_backend="marlin", attention_backend="torch_native")
    names = {f["name"] for f in startup_log.extract(startup_log.log_lines(lines))["fallbacks"]}
    assert names == {"MoE runner resolved to a fallback kernel", "torch-native attention"}


def test_only_the_latest_start_is_read() -> None:
    earlier = [
        *decode_log("2026-12-03 09:00:00"),
        line(message("fallback_fp8_moe", backend="X"), " TP0", "2026-12-03 09:00:01"),
    ]
    later = decode_log("2026-12-03 10:00:00", moe_runner_backend="flashinfer_trtllm")
    lines = startup_log.log_lines([*earlier, *later], since="2026-12-03 09:30:00")
    record = startup_log.extract(lines)
    assert record["fallbacks"] == [] and record["choices"]["moe_runner_backend"] == "flashinfer_trtllm"
    assert startup_log.extract(startup_log.log_lines([*earlier, *later]))["fallbacks"]


def test_lines_with_milliseconds_and_other_rank_prefixes_parse() -> None:
    parsed = startup_log.parse_line(
        "[2026-12-03 10:00:00.123 DP0 TP3 EP3] NIXL KVManager initialized with backend: UCX"
    )
    assert parsed is not None and parsed.ranks == "DP0 TP3 EP3" and parsed.msg.endswith("backend: UCX")
    assert startup_log.parse_line("2026-12-03 10:00:00,123 pd-sim-worker INFO started") is None


def test_server_args_with_a_value_without_a_literal_repr_still_gives_its_keys() -> None:
    msg = (
        "server_args={'kv_cache_dtype': 'fp8_e4m3', 'device': device(type='cuda'), 'tp_size': 4, "
        "'cuda_graph_config': {'decode': {'backend': 'full', 'max_bs': 8, 'bs': [1, 2, 4, 8]}}}"
    )
    parsed = startup_log.parse_server_args(msg)
    assert parsed["kv_cache_dtype"] == "fp8_e4m3" and parsed["tp_size"] == 4
    assert parsed["cuda_graph_decode"] == {"backend": "full", "max_bs": 8, "bs": [1, 2, 4, 8]}


def test_record_program_reads_since_the_start_and_writes_the_record(tmp_path: Path) -> None:
    log = tmp_path / "decode.log"
    stale = line(message("fallback_fp8_moe", backend="X"), " TP0", "2000-01-01 00:00:01")
    old = [*decode_log("2000-01-01 00:00:00"), stale]
    started = time.time() - 5
    now = startup_log.local_timestamp(started + 2)
    log.write_text("\n".join([*old, *decode_log(now)]) + "\n")
    out = tmp_path / "state" / "decode.json"
    record = startup_log.record_program(
        {"start": started, "pid": os.getpid()}, "pd:decode", str(log), str(out)
    )
    assert record["fallbacks"] == [] and record["choices"]["cuda_graph_bs"] == DECODE_BS
    assert json.loads(out.read_text())["choices"]["attention_impl"] == "DeepseekV4AttnBackend"
    assert set(record["env"]) <= set(startup_log.ENGINE_ENV)
    assert startup_log.read_records(tmp_path / "state", ["decode", "prefill"])["prefill"]["error"].startswith(
        "no start-up record at"
    )


def test_an_unreadable_log_says_so(tmp_path: Path) -> None:
    record = startup_log.parse_log(tmp_path / "missing.log")
    assert record["error"].startswith(f"cannot read {tmp_path / 'missing.log'}")
