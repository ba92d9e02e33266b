"""Day-2 logic: GPU memory attribution, secret redaction, diagnostics bundles, kernel ranking."""

from __future__ import annotations

import gzip
import json
import tarfile

from pd_appliance.serving.day2 import (
    REDACTED,
    diagnostics,
    find_traces,
    gpu_memory_by_program,
    owner_program,
    redact_text,
    top_kernels,
)


def test_tp_ranks_are_attributed_to_their_program() -> None:
    # supervisord(1) -> launcher exec'd into sglang prefill (100) -> TP ranks 101..104; decode 200 -> 201
    parents = {100: 1, 101: 100, 102: 100, 103: 101, 200: 1, 201: 200, 300: 1}
    programs = {"prefill": 100, "decode": 200, "router": 0}
    assert owner_program(103, programs, parents) == "prefill"
    assert owner_program(300, programs, parents) is None
    memory = gpu_memory_by_program(
        [(101, 80000, "GPU-0"), (102, 80000, "GPU-1"), (201, 70000, "GPU-4"), (300, 10, "GPU-7")],
        programs,
        parents,
    )
    assert memory["prefill"]["memory_mib"] == 160000 and memory["prefill"]["gpus"] == ["GPU-0", "GPU-1"]
    assert memory["decode"]["memory_mib"] == 70000 and memory["other"]["pids"] == [300]


def test_redaction_of_known_values_flags_and_secret_names() -> None:
    text = (
        "command=smg launch --api-key abc123456 --port 8000\n"
        'environment=HF_TOKEN="hf_xyz",UCX_TLS="tcp",MY_SECRET=\'s\'\n'
        "SERVING_ROUTER_API_KEY=k3y-value\n"
        "log: connected with k3y-value\n"
    )
    out = redact_text(text, secrets=["k3y-value"])
    assert "abc123456" not in out and "hf_xyz" not in out and "k3y-value" not in out
    assert f"--api-key {REDACTED}" in out and 'UCX_TLS="tcp"' in out
    assert f"SERVING_ROUTER_API_KEY={REDACTED}" in out and f"log: connected with {REDACTED}" in out


def test_diagnostics_bundle_redacts_env_file_values_everywhere(tmp_path) -> None:
    config = tmp_path / "etc"
    (config / "serving").mkdir(parents=True)
    (config / "serving" / "router.env").write_text(
        "SERVING_ROUTER_API_KEY=supersecretkey\nOTHER=plainvalue1\n"
    )
    logs = tmp_path / "log"
    logs.mkdir()
    (logs / "router.log").write_text("started with supersecretkey and plainvalue1\n")
    out = tmp_path / "bundle" / "b.tar.gz"
    out.parent.mkdir()
    result = diagnostics(
        str(out), [f"config={config}", f"logs={logs}"], {"state.txt": "ok"}, str(tmp_path / "nopython")
    )
    with tarfile.open(out) as tar:
        names = tar.getnames()
        texts = {n: tar.extractfile(n).read().decode() for n in names}
    assert "diagnostics/config/serving/router.env" in names and "diagnostics/logs/router.log" in names
    assert (
        "diagnostics/pip-freeze-sglang.txt" in names
        and "does not exist" in texts["diagnostics/pip-freeze-sglang.txt"]
    )
    assert all("supersecretkey" not in t and "plainvalue1" not in t for t in texts.values())
    assert result["redacted_values"] == 2 and (out.stat().st_mode & 0o777) == 0o600


def test_top_kernels_ranks_by_total_time_across_traces(tmp_path) -> None:
    def trace(name: str, events: list[tuple[str, float]], gz: bool) -> None:
        payload = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": n, "dur": d} for n, d in events]
                   + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 9999.0}]}  # fmt: skip
        data = json.dumps(payload).encode()
        (tmp_path / name).write_bytes(gzip.compress(data) if gz else data)

    trace("rank0.trace.json.gz", [("_tiled_sparse_decode_kernel", 630.0), ("moe_gemv", 250.0)], gz=True)
    trace("rank1.trace.json", [("_tiled_sparse_decode_kernel", 600.0), ("rmsnorm", 20.0)], gz=False)
    report = top_kernels(find_traces(str(tmp_path)), top=2)
    assert [row["kernel"] for row in report["top"]] == ["_tiled_sparse_decode_kernel", "moe_gemv"]
    assert report["top"][0]["calls"] == 2 and report["top"][0]["total_ms"] == 1.23
    assert report["kernel_time_ms"] == 1.5 and report["top"][0]["share"] == 0.82
    assert report["stand_in"] == []


def test_top_kernels_names_what_wrote_a_trace_in_an_engine_s_place(tmp_path) -> None:
    events = [{"ph": "X", "cat": "kernel", "name": "k", "dur": 5.0}]
    (tmp_path / "a.trace.json").write_text(
        json.dumps({"stand_in": "an engine stand-in", "traceEvents": events})
    )
    (tmp_path / "b.trace.json").write_text(json.dumps({"traceEvents": events}))
    report = top_kernels(find_traces(str(tmp_path)))
    assert report["stand_in"] == ["an engine stand-in"] and report["top"][0]["calls"] == 2
