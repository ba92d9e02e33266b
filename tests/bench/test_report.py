"""The report: every figure in JSON, a readable Markdown, a PNG, history and the A/B selection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_gates import THRESHOLDS, measurement

from pd_appliance.bench import history
from pd_appliance.bench.report import (
    ReportError,
    accept,
    build_report,
    select_fastest,
    spread_whiskers,
    write_report,
)

META = {
    "host": "gpu-node-01",
    "appliance_commit": "abc1234",
    "gpus": [{"index": 4, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}],
    "versions": {"sglang": "0.5.23", "smg": "1.13.0"},
    "env_hooks": {"decode": {"SGLANG_SM120_FLASHMLA_BACKEND": "triton"}},
}


def variant(name: str, bs1: float, c16: float, probe: bool = True, errors16: int = 0) -> dict:
    m = measurement(bs1, c16, errors16=errors16, probe=probe)
    m["variant"] = name
    for p in m["phases"]:
        p.update(
            completed=p["requests"] - p["errors"],
            wall_s=3.0,
            ttft_ms={"p50": 100.0, "p90": 120.0, "p99": 150.0},
            tpot_ms={"p50": 10.0, "p90": 11.0, "p99": 12.0},
            itl_ms={"p50": 10.0, "p90": 11.0, "p99": 13.0},
        )
    m["workloads"] = [
        {"concurrency": 1, "num_requests": 8, "warmup_requests": 1, "api": "completions", "input_len": 1024,
         "output_len": 256, "request_timeout_s": 600.0},
    ]  # fmt: skip
    return m


def test_failed_report_is_written_with_all_parts(tmp_path: Path) -> None:
    report = build_report([variant("deployed", 9.5, 30.0)], "deployed", THRESHOLDS, metadata=META)
    paths = write_report(report, tmp_path)
    assert report["passed"] is False
    data = json.loads(Path(paths["json"]).read_text())
    assert data["thresholds"] == {"bs=1": 10.0, "C=16": 25.0}
    assert data["metadata"]["gpus"][0]["name"].startswith("NVIDIA RTX PRO 6000")
    assert data["metadata"]["env_hooks"]["decode"]["SGLANG_SM120_FLASHMLA_BACKEND"] == "triton"
    assert data["metadata"]["appliance_commit"] == "abc1234"
    assert data["variants"][0]["phases"][1]["output_tok_s"] == 30.0
    md = Path(paths["markdown"]).read_text()
    assert "— FAILED" in md and "bs=1 output throughput 9.50 tok/s < threshold 10.00 tok/s" in md
    assert "| deployed | pass | 16 | 32 | 0 | 30.00 |" in md
    assert Path(paths["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _assert_plot_is_drawn(Path(paths["png"]))
    assert len(list((tmp_path / "runs").glob("*.json"))) == 1


def _assert_plot_is_drawn(png: Path) -> None:
    """Decode the PNG (matplotlib's reader, the library that drew it) and look at the pixels: the
    figure's size (12 x 4.8 in at 110 dpi), ink on the canvas, and the bars in the first level's colour."""
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(str(png))[..., :3]
    assert pixels.shape[:2] == (528, 1320), pixels.shape
    ink = np.any(pixels < 0.9, axis=-1).mean()
    assert 0.02 < ink < 0.9, f"{ink:.1%} of the plot is drawn on"
    bar_colour = np.array([0x1F, 0x77, 0xB4]) / 255.0  # matplotlib's first cycle colour: the bs=1 bars
    bars = np.all(np.abs(pixels - bar_colour) < 0.02, axis=-1).sum()
    assert bars > 500, f"only {bars} pixels of bar colour: the bars were not drawn"


def test_plot_missing_matplotlib_keeps_json_and_markdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    report = build_report([variant("deployed", 20, 30)], "deployed", THRESHOLDS, metadata=META)
    paths = write_report(report, tmp_path)
    assert paths["png"] is None
    assert "matplotlib is missing" in json.loads(Path(paths["json"]).read_text())["plot_note"]
    assert "matplotlib is missing" in Path(paths["markdown"]).read_text()


def test_controller_copy_is_the_hosts_report_with_the_plot_drawn_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """roles/validation: the host writes the report without matplotlib and returns it; `pd-bench copy`
    on the controller writes the same JSON and Markdown from that result, and draws the plot."""
    import io

    from pd_appliance.bench import cli

    report = build_report([variant("deployed", 20, 30)], "deployed", THRESHOLDS, metadata=META)
    host = write_report(report, tmp_path / "host", plot=False)
    result = json.loads(json.dumps(report))  # what the module's result carries to the controller
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(result)))
    assert cli.main(["copy", str(tmp_path / "controller")]) == 0
    paths = json.loads(capsys.readouterr().out)
    assert Path(paths["json"]).read_text() == Path(host["json"]).read_text()
    assert Path(paths["markdown"]).read_text() == Path(host["markdown"]).read_text()
    _assert_plot_is_drawn(Path(paths["png"]))
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(result)))
    assert cli.main(["copy", str(tmp_path / "unplotted"), "--no-plot"]) == 0
    assert json.loads(capsys.readouterr().out)["png"] is None
    assert not (tmp_path / "unplotted" / "report.png").exists()


def test_select_fastest_ignores_probe_failures_and_erroring_variants() -> None:
    runs = [
        variant("deployed", 10, 40),
        variant("flashinfer", 11, 55),
        variant("garbage-fast", 0, 0, probe=False),
        variant("flaky-fastest", 12, 90, errors16=2),
    ]
    selection = select_fastest(runs, 16)
    assert selection["fastest"] == "flashinfer"
    assert [r["variant"] for r in selection["ranking"]][:2] == ["flashinfer", "deployed"]
    assert select_fastest([variant("x", 0, 0, probe=False)], 16)["fastest"] is None


def test_gates_apply_to_the_running_variant_and_all_variants_are_reported(tmp_path: Path) -> None:
    runs = [variant("deployed", 9, 20), variant("mtp-on", 14, 30)]
    report = build_report(runs, "mtp-on", THRESHOLDS, selection=select_fastest(runs, 16), metadata=META)
    assert report["passed"] is True
    assert report["variants_passing_floors"] == {"deployed": False, "mtp-on": True}
    md = Path(write_report(report, tmp_path)["markdown"]).read_text()
    assert "| deployed |" in md and "| mtp-on |" in md and "**mtp-on**" in md
    with pytest.raises(ReportError, match="'nope' is not among"):
        build_report(runs, "nope", THRESHOLDS)


def test_history_accept_then_regression(tmp_path: Path) -> None:
    hist = tmp_path / "history.jsonl"
    first = build_report(
        [variant("deployed", 20, 100)], "deployed", THRESHOLDS, 0.1, history.last_accepted(hist)
    )
    assert first["passed"] and not [g for g in first["gates"] if g["name"].startswith("regression")]
    accept(first, hist)
    slower = build_report(
        [variant("deployed", 20, 80)], "deployed", THRESHOLDS, 0.1, history.last_accepted(hist)
    )
    assert slower["passed"] is False
    assert "C=16 output tok/s 80.00 < 90.00 (last accepted 100.00" in slower["failure_message"]
    with pytest.raises(ReportError, match="only a passed report"):
        accept(slower, hist)
    assert len(history.load(hist)) == 1


def test_corrupt_history_names_file_and_line(tmp_path: Path) -> None:
    hist = tmp_path / "history.jsonl"
    hist.write_text('{"figures": {}}\n{not json\n')
    with pytest.raises(history.HistoryError, match=r"history.jsonl:2 is not JSON"):
        history.load(hist)
    assert hist.read_text().count("\n") == 2  # nothing lost


def _startup(fallbacks: list[dict]) -> dict:
    choices = {"attention_backend": "dsv4", "attention_impl": "DeepseekV4AttnBackend",
               "moe_runner_backend": "flashinfer_cutlass", "kv_cache_dtype": "fp8_e4m3",
               "cuda_graph_capture": "target decode", "cuda_graph_bs": [1, 2, 4, 8, 12, 16, 24, 32],
               "transfer_backend": "nixl", "nixl_backend": "UCX"}  # fmt: skip
    return {"choices": choices, "fallbacks": fallbacks, "env": {"UCX_TLS": "cuda_ipc,cuda_copy,sm,self,tcp"}}


def test_what_each_worker_chose_is_listed_and_a_fallback_in_its_log_fails_validation(tmp_path: Path) -> None:
    msg = "Fp8MoEMethod has no FLASHINFER_CUTLASS path; using triton for its fp8 experts."
    line = f"[2026-12-03 10:00:00 TP0] {msg}"
    fallback = {"name": "Triton fused-MoE fallback for fp8 experts", "line": line, "count": 4,
                "flag": "--moe-runner-backend (serving_moe_runner_backend)",
                "source": "srt/layers/quantization/fp8.py Fp8MoEMethod.create_moe_runner"}  # fmt: skip
    startup = {"gpu-node-01": {"prefill": _startup([]), "decode": _startup([fallback])}}
    report = build_report(
        [variant("deployed", 80.0, 400.0)], "deployed", THRESHOLDS, metadata=META, engine_startup=startup
    )
    assert report["passed"] is False
    assert "pd:decode on gpu-node-01 named a fallback in its start-up log" in report["failure_message"]
    assert line in report["failure_message"] and "--moe-runner-backend" in report["failure_message"]
    passed = {g["name"]: g["passed"] for g in report["gates"]}
    assert passed["engine start-up gpu-node-01/prefill"] is True
    assert passed["engine fallback gpu-node-01/decode"] is False
    md = Path(write_report(report, tmp_path, plot=False)["markdown"]).read_text()
    assert "## What each worker's engine chose (from its start-up log)" in md
    assert "| gpu-node-01/prefill | dsv4 / DeepseekV4AttnBackend | flashinfer_cutlass |" in md
    assert "target decode: 8 sizes: 1..32" in md and "UCX_TLS=cuda_ipc,cuda_copy,sm,self,tcp" in md
    assert f"- gpu-node-01/decode: `{line}`" in md
    clean = {"gpu-node-01": {"prefill": _startup([]), "decode": _startup([])}}
    assert build_report([variant("deployed", 80.0, 400.0)], "deployed", THRESHOLDS, engine_startup=clean)[
        "passed"
    ]


def test_the_report_prints_each_figure_with_its_spread_and_the_tolerance_applied(tmp_path: Path) -> None:
    m = variant("deployed", 20.0, 1234.0)
    m["phases"][1]["spread"] = {
        "p10": 1200.0, "p50": 1236.0, "p90": 1260.0, "mean": 1234.0, "cv": 0.021,
        "waves": 6, "measured_s": 61.2,
    }  # fmt: skip
    m["request_settings"] = {
        "temperature": 0.0, "ignore_eos": True, "thinking": False,
        "prompt_corpus": "prompts.txt (64 passages)",
    }  # fmt: skip
    last = {
        "accepted_at": "2026-12-01T00:00:00Z",
        "figures": {"bs=1 output tok/s": 20.0, "C=16 output tok/s": 1250},
    }
    report = build_report([m], "deployed", THRESHOLDS, regression_tolerance=0.01, last_accepted=last)
    paths = write_report(report, tmp_path)
    md = Path(paths["markdown"]).read_text()
    assert "- **deployed** C=16: 1,234 tok/s (p10 1,200 / p90 1,260, CV 2.1 %, 6 waves, 61 s)" in md
    # The plot's C=16 bar has whiskers down to p10 and up to p90; bs=1, without waves, has none.
    (below_bs1, below_c16), (above_bs1, above_c16) = spread_whiskers(m["phases"])
    assert (below_c16, above_c16) == (34.0, 26.0) and math.isnan(below_bs1) and math.isnan(above_bs1)
    assert Path(paths["png"]).stat().st_size > 10_000
    assert "- **deployed** bs=1: 20 tok/s (no waves" in md
    # C=16's waves spread (1236 - 1200) / 1236 = 2.9 %, wider than the configured 1 %: that applies.
    assert report["regression_tolerances"]["C=16"]["source"] == "spread"
    assert "- C=16: tolerance 2.9%: the waves' (p50-p10)/p50 of 6 waves, wider than the configured 1.0%" in md
    assert "- bs=1: tolerance 1.0%: the configured one (no wave spread measured)" in md
    assert report["passed"] is True  # 1234 is 1.3 % below 1250: within the spread, not the 1 %
    assert "temperature 0, ignore_eos true, chat template thinking off" in md
    assert "prompts from the corpus prompts.txt (64 passages)" in md
