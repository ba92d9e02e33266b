"""The rehearsal engine's launch refusals (GPU count, architecture) and its start-up time, as SGLang's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pd_standins.engine import cli, launch_checks, startup
from pd_standins.engine.launch_checks import LaunchRefused
from pd_standins.gpus import simulated_gpu
from pd_standins.hub import generate
from pd_testlib import reserve_ports

WORKER = str(Path(sys.executable).parent / "pd-sim-worker")


# ---- GPUs ---------------------------------------------------------------------------------------
def test_each_rank_gets_the_visible_gpu_sglang_gives_it() -> None:
    assert launch_checks.check_gpus(4, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == [4, 5, 6, 7]
    assert launch_checks.check_gpus(2, base_gpu_id=1, gpu_id_step=2, env={}) == [1, 3]
    uuids = ",".join(simulated_gpu(i)["uuid"] for i in (6, 7))
    assert launch_checks.check_gpus(2, env={"CUDA_VISIBLE_DEVICES": uuids}) == [6, 7]


@pytest.mark.parametrize(
    ("visible", "message"),
    [
        ("0,1", "gpu_id=2 os.environ.get('CUDA_VISIBLE_DEVICES')='0,1' get_parallel().tp_rank=2"),
        ("0,1,9,3", "invalid device ordinal (2 GPU(s) visible"),  # CUDA stops at the first bad entry
        ("", "RuntimeError: No CUDA GPUs are available"),
    ],
)
def test_fewer_visible_gpus_than_tp_ranks_fail_as_torch_does(visible: str, message: str) -> None:
    with pytest.raises(LaunchRefused) as refused:
        launch_checks.check_gpus(4, env={"CUDA_VISIBLE_DEVICES": visible})
    assert message in str(refused.value)


def test_more_visible_gpus_than_ranks_start_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert launch_checks.check_gpus(4, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"}) == [0, 1, 2, 3]
    assert "makes 6 GPUs visible; --tp-size 4 uses 4" in caplog.text


# ---- the model ----------------------------------------------------------------------------------
def test_the_rehearsal_checkpoint_is_the_served_architecture(tmp_path: Path) -> None:
    generate(tmp_path)
    assert launch_checks.check_architecture(str(tmp_path))["architectures"] == ["DeepseekV4ForCausalLM"]
    assert launch_checks.check_architecture("deepseek-ai/DeepSeek-V4-Flash") is None  # a Hub id


def test_another_architecture_or_no_config_is_refused_as_sglangs_registry_does(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(LaunchRefused, match=r"Model architectures \['LlamaForCausalLM'\] are not"):
        launch_checks.check_architecture(str(tmp_path))
    (tmp_path / "config.json").unlink()
    with pytest.raises(LaunchRefused, match=r"does not appear to have a file named config\.json"):
        launch_checks.check_architecture(str(tmp_path))


# ---- start-up time ------------------------------------------------------------------------------
def test_decode_graph_batch_sizes_are_sglangs_list() -> None:
    assert startup.decode_capture_batch_sizes(32, speculative=False) == [1, 2, 4, 8, 12, 16, 24, 32]
    spec = startup.decode_capture_batch_sizes(32, speculative=True)
    assert spec == [1, 2, 3, 4, 5, 6, 7, 8, *range(10, 33, 2)] and len(spec) == 20
    assert startup.decode_capture_batch_sizes(20, speculative=False) == [1, 2, 4, 8, 12, 16, 20]
    assert len(startup.decode_capture_batch_sizes(512, speculative=False)) == 52
    # RTX PRO 6000 (97,887 MiB): H200's band in memory_hook.py, 512 at TP >= 4, 256 below.
    assert startup.default_decode_max_bs(97887, 4) == 512 and startup.default_decode_max_bs(97887, 2) == 256


def _args(*argv: str) -> object:
    return cli.parse_args(["--model-path", "m", *argv])


def test_who_captures_what() -> None:
    decode = _args("--disaggregation-mode", "decode", "--cuda-graph-max-bs-decode", "32")
    assert startup.capture_batch_sizes("decode", decode, 97887) == [1, 2, 4, 8, 12, 16, 24, 32]
    assert startup.capture_batch_sizes("prefill", decode, 97887) == []
    off = _args("--disable-cuda-graph")
    assert startup.capture_batch_sizes("decode", off, 97887) == []
    capped = _args("--tp-size", "4", "--max-running-requests", "48")
    assert startup.capture_batch_sizes("decode", capped, 97887)[-1] == 48
    listed = _args("--cuda-graph-bs-decode", "4", "1", "2")
    assert startup.capture_batch_sizes("decode", listed, 97887) == [1, 2, 4]


def test_the_plan_reads_the_checkpoint_share_the_rate_and_the_warm_caches(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for i in range(2):  # sparse: 2 x 2 GB on the books, nothing on disk
        with (model / f"model-0000{i + 1}-of-00002.safetensors").open("wb") as shard:
            shard.truncate(2 * 10**9)
    (model / "config.json").write_text("{}")
    env = {"HOME": str(tmp_path / "home"), "USER": "svc", "TMPDIR": str(tmp_path)}
    args = cli.parse_args(
        [
            "--model-path",
            str(model),
            "--tp-size",
            "4",
            "--cuda-graph-max-bs-decode",
            "32",
            "--sim-weight-read-gbps",
            "0.5",
            "--sim-jit-compile-s",
            "7",
            "--sim-graph-capture-ms-per-bs",
            "250",
        ]
    )
    cold = startup.plan(args, "decode", 97887, env)
    assert cold.weight_bytes == 4 * 10**9 and cold.load_s == pytest.approx(2.0)  # 1 GB share at 0.5 GB/s
    assert [loc.key for loc in cold.cold_caches] == ["triton", "flashinfer", "tilelang"] and cold.jit_s == 21
    assert cold.capture_s == pytest.approx(2.0)  # 8 sizes at 250 ms
    for loc in cold.cold_caches:
        loc.path.mkdir(parents=True)
    startup.mark_warm(cold.cold_caches)
    warm = startup.plan(args, "decode", 97887, env)
    assert warm.cold_caches == [] and warm.total_s == pytest.approx(4.0)
    (cold.cold_caches[1].path / startup.WARM_MARKER).unlink()  # FlashInfer's cache wiped
    assert [loc.key for loc in startup.plan(args, "decode", 97887, env).cold_caches] == ["flashinfer"]
    args.sim_weight_bytes = 149e9  # the lab's checkpoint, without the disk
    assert startup.plan(args, "decode", 97887, env).load_s == pytest.approx(149e9 / 4 / 0.5e9)


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_port_opens_after_the_start_up_and_health_is_503_through_warm_up(tmp_path: Path) -> None:
    port = reserve_ports(1)[0]
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PD_SIM_WEIGHT_BYTES": str(6 * 10**9),
        "PD_SIM_WEIGHT_READ_GBPS": "1",
        "PD_SIM_JIT_COMPILE_S": "0",
        "PD_SIM_GRAPH_CAPTURE_MS_PER_BS": "100",
        "PD_SIM_TTFT_MS": "400",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    argv = [
        WORKER,
        "--model-path",
        "m",
        "--tp-size",
        "4",
        "--port",
        str(port),
        "--cuda-graph-max-bs-decode",
        "8",
    ]
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        statuses = []
        while time.monotonic() - started < 30:
            if _closed(port):
                statuses.append("closed")
            else:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        statuses.append(r.status)
                        break
                except urllib.error.HTTPError as exc:
                    statuses.append(exc.code)
            time.sleep(0.05)
        took = time.monotonic() - started
        # 1.5 GB share at 1 GB/s + 4 graphs (1, 2, 4, 8) at 100 ms: closed for ~1.9 s, then 503 (warm-up).
        assert statuses[0] == "closed" and statuses[-1] == 200 and 503 in statuses, statuses
        assert 1.9 <= took < 15, took
        first_open = statuses.index(next(s for s in statuses if s != "closed"))
        assert first_open * 0.05 >= 1.5
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "this rank's share 1.50 GB (TP 4): 1.5 s" in err
    assert "decode batch sizes [1, 2, 4, 8]: 0.4 s" in err


def test_a_refused_launch_exits_1_with_the_error_last(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"}
    for argv, last in (
        (["--model-path", "m", "--tp-size", "4"], "CUDA error: invalid device ordinal"),
        (["--model-path", str(tmp_path), "--tp-size", "2"], "Model architectures ['Qwen3ForCausalLM']"),
    ):
        result = subprocess.run(
            [WORKER, *argv, "--port", "0"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 1 and last in result.stderr.strip().splitlines()[-1], result.stderr
