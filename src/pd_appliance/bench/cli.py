"""`pd-bench`: measure an OpenAI-compatible server, gate the figures, write the report.

    pd-bench run --url http://127.0.0.1:8000 --concurrency 1 16 --num-requests 8 64 \
        --tokenizer /srv/models/DeepSeek-V4-Flash-NVFP4 --decode-metrics-url http://10.0.0.5:30001/metrics \
        --out run.json
    pd-bench report run.json [more variants...] --threshold 1=40 --threshold 16=130 \
        --target 1=210 --target 16=1000 --check-decode-concurrency --out-dir report/
    pd-bench plot report/report.json
    pd-bench copy artifacts/validation/node1 < report.json   # the controller's copy, plotted

`run` exits 2 when the correctness probe fails and 1 when a level's error rate exceeds
--max-error-rate (default 0: any failed request); `report` exits 1 when a gate fails (after the
report is written). 3 is a usage or input error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pd_appliance.bench import history
from pd_appliance.bench.gates import concurrency_label
from pd_appliance.bench.report import (
    ReportError,
    accept,
    build_report,
    render_plot,
    select_fastest,
    write_copy,
    write_report,
)
from pd_appliance.bench.workload import PROBE_API, PROBE_EXPECT, PROBE_PROMPT, WorkloadError

# The runner (aiohttp, the client) is imported only by `run`: `copy` and `report` start faster.


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a fraction of requests from 0 to 1 (0.05 = 5 %), got {text!r}"
        )
    return value


def error_rate_failures(result: dict[str, Any], max_error_rate: float) -> list[str]:
    """One line per measured level whose failed share exceeds `max_error_rate` (no requests: 100 %)."""
    failures = []
    for phase in result.get("phases") or []:
        requests, errors = int(phase["requests"]), int(phase["errors"])
        rate = errors / requests if requests else 1.0
        if rate > max_error_rate:
            failures.append(
                f"{concurrency_label(phase['concurrency'])}: {errors} of {requests} requests failed "
                f"({rate:.1%}), above --max-error-rate {max_error_rate:g}"
            )
    return failures


def _threshold(text: str) -> tuple[int, float]:
    try:
        level, value = text.split("=", 1)
        return int(level), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CONCURRENCY=MIN_TOK_S (e.g. 16=25.0), got {text!r}"
        ) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pd-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="probe and measure one configuration")
    run.add_argument("--url", required=True, help="base URL of the router, e.g. http://127.0.0.1:8000")
    run.add_argument("--model", default="", help="model name (default: first of /v1/models)")
    run.add_argument("--api", choices=["completions", "chat"], default="completions")
    run.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    run.add_argument(
        "--num-requests", type=int, nargs="+", default=[8, 64], help="one, or one per concurrency"
    )
    run.add_argument("--warmup-requests", type=int, nargs="+", help="default: one per concurrency slot")
    run.add_argument(
        "--min-measure-s", type=float, default=0.0,
        help="measure each level for at least this many seconds of steady-state waves (default 0)",
    )  # fmt: skip
    run.add_argument(
        "--min-waves", type=int, default=1,
        help="measure at least this many waves (a wave: as many completed requests as the concurrency)",
    )  # fmt: skip
    run.add_argument(
        "--thinking", action="store_true", help="chat API: turn the chat template's thinking mode on"
    )
    run.add_argument("--input-len", type=int, default=1024)
    run.add_argument("--output-len", type=int, default=256)
    run.add_argument("--tokenizer", help="tokenizer.json (or its directory) for exact input token counts")
    run.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    run.add_argument("--ready-timeout", type=float, default=0.0, help="wait this long for /readiness first")
    run.add_argument("--probe-prompt", default=PROBE_PROMPT)
    run.add_argument("--probe-expect", default=PROBE_EXPECT)
    run.add_argument("--probe-api", choices=["completions", "chat"], default=PROBE_API)
    run.add_argument("--variant", default="deployed", help="name of this configuration in the report")
    run.add_argument(
        "--api-key-env", default="PD_BENCH_API_KEY", help="environment variable holding the API key"
    )
    run.add_argument(
        "--max-error-rate", type=_fraction, default=0.0,
        help="exit 1 when a level's share of failed requests exceeds this (default 0: any failure)",
    )  # fmt: skip
    run.add_argument(
        "--decode-metrics-url",
        action="append",
        default=[],
        help="a decode worker's /metrics: sglang:num_running_reqs is sampled while each level runs (repeat)",
    )
    run.add_argument("--metrics-interval", type=float, default=1.0, help="seconds between /metrics reads")
    run.add_argument("--raw", action="store_true", help="keep every request's raw timestamps in the output")
    run.add_argument("--out", help="write the measurement JSON here")

    rep = sub.add_parser("report", help="gate measurements and write report.json/.md/.png")
    rep.add_argument("measurements", nargs="+", help="measurement JSON files from `pd-bench run`")
    rep.add_argument(
        "--threshold", type=_threshold, action="append", default=[], help="CONCURRENCY=MIN_TOK_S"
    )
    rep.add_argument(
        "--target", type=_threshold, action="append", default=[], help="CONCURRENCY=TOK_S, reported only"
    )
    rep.add_argument(
        "--check-decode-concurrency",
        action="store_true",
        help="gate each thresholded level above 1 on the decode workers' running-requests peak",
    )
    rep.add_argument("--selected", help="variant left running (default: the first)")
    rep.add_argument("--history", help="history of accepted runs (JSON lines)")
    rep.add_argument(
        "--regression-tolerance", type=float, help="fail when a figure drops more than this fraction"
    )
    rep.add_argument(
        "--max-error-rate", type=_fraction, default=0.0, help="share of failed requests a level may have"
    )
    rep.add_argument("--accept", action="store_true", help="append a passed run to --history")
    rep.add_argument("--metadata", help="JSON file merged into the report's metadata")
    rep.add_argument("--out-dir", required=True)

    plot = sub.add_parser("plot", help="draw report.png next to a report.json")
    plot.add_argument("report")
    plot.add_argument("--out", help="PNG path (default: report.png beside the JSON)")

    copy = sub.add_parser(
        "copy", help="write a report read from stdin (JSON) into a directory, with its plot; print the paths"
    )
    copy.add_argument("out_dir")
    copy.add_argument("--no-plot", dest="plot", action="store_false", help="write no report.png")
    return parser


def _print_summary(result: dict[str, Any]) -> None:
    probe = result.get("probe") or {}
    print(
        f"probe: {'pass' if probe.get('passed') else 'FAIL'} "
        f"answer={probe.get('answer', '')!r} {probe.get('error', '')}"
    )
    print(
        f"{'level':>6} {'reqs':>5} {'err':>4} {'out tok/s':>10} {'req tok/s':>10} {'TTFT p50/p99 ms':>18} "
        f"{'TPOT p50/p99 ms':>18} {'wall s':>7}"
    )
    for p in result["phases"]:
        ttft, tpot, rate = p["ttft_ms"], p["tpot_ms"], p["request_tok_s"]["p50"]
        print(
            f"{concurrency_label(p['concurrency']):>6} {p['requests']:>5} {p['errors']:>4} "
            f"{p['output_tok_s']:>10.2f} "
            f"{(rate or 0):>10.2f} {(ttft['p50'] or 0):>8.1f}/{(ttft['p99'] or 0):<9.1f} "
            f"{(tpot['p50'] or 0):>8.2f}/{(tpot['p99'] or 0):<9.2f} {p['wall_s']:>7.2f}"
        )
        spread = p.get("spread") or {}
        if spread.get("p50") is not None:
            cv = f"{spread['cv'] * 100:.1f} %" if spread.get("cv") is not None else "-"
            print(
                f"       waves: {spread['waves']} in {spread['measured_s']:.1f} s, "
                f"p10 {spread['p10']:.2f} / p50 {spread['p50']:.2f} / p90 {spread['p90']:.2f} tok/s, CV {cv}"
            )
        for sample in p["error_samples"]:
            print(f"       error: {sample}")
        running = p.get("decode_running")
        if running:
            print(f"       decode running requests: peak {running['peak']} of {p['concurrency']} asked")


def _run(args: argparse.Namespace) -> int:
    from pd_appliance.bench.runner import ProbeSpec, measure_sync, plan_from_lists

    plan = plan_from_lists(
        args.url,
        args.concurrency,
        args.num_requests,
        args.input_len,
        args.output_len,
        args.warmup_requests,
        args.api,
        args.request_timeout,
        args.min_measure_s,
        args.min_waves,
        args.thinking,
        model=args.model,
        api_key=os.environ.get(args.api_key_env, ""),
        tokenizer=args.tokenizer,
        probe=ProbeSpec(args.probe_prompt, args.probe_expect, args.probe_api),
        ready_timeout_s=args.ready_timeout,
        variant=args.variant,
        decode_metrics_urls=args.decode_metrics_url,
        metrics_interval_s=args.metrics_interval,
    )
    result = measure_sync(plan, keep_records=args.raw)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    _print_summary(result)
    if not (result.get("probe") or {}).get("passed"):
        return 2
    failures = error_rate_failures(result, args.max_error_rate)
    for line in failures:
        print(f"pd-bench: {line}", file=sys.stderr)
    return 1 if failures else 0


def _report(args: argparse.Namespace) -> int:
    measurements = [json.loads(Path(f).read_text(encoding="utf-8")) for f in args.measurements]
    selected = args.selected or measurements[0].get("variant")
    thresholds = dict(args.threshold)
    metadata = json.loads(Path(args.metadata).read_text(encoding="utf-8")) if args.metadata else {}
    last = history.last_accepted(args.history) if args.history else None
    levels = [c for c in thresholds if c > 1] if args.check_decode_concurrency else []
    selection = (
        select_fastest(measurements, max(thresholds) if thresholds else 16, thresholds, 0.0, levels)
        if len(measurements) > 1
        else None
    )
    report = build_report(
        measurements, selected, thresholds, args.regression_tolerance, last, metadata, selection,
        max_error_rate=args.max_error_rate, targets=dict(args.target), decode_concurrency_levels=levels,
    )  # fmt: skip
    paths = write_report(report, args.out_dir)
    if args.accept and args.history and report["passed"]:
        accept(report, args.history)
    for gate in report["gates"]:
        print(f"{'pass' if gate['passed'] else 'FAIL'}: {gate['message']}")
    for target in report["targets"]:
        print(f"not gated: {target['message']}")
    print(f"report: {paths['json']} {paths['markdown']} {paths['png'] or '(no plot)'}")
    return 0 if report["passed"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "report":
            return _report(args)
        if args.command == "copy":
            print(json.dumps(write_copy(json.load(sys.stdin), args.out_dir, plot=args.plot)))
            return 0
        report_path = Path(args.report)
        render_plot(
            json.loads(report_path.read_text(encoding="utf-8")),
            Path(args.out or report_path.with_suffix(".png")),
        )
        return 0
    except (WorkloadError, ReportError, history.HistoryError, OSError, json.JSONDecodeError) as exc:
        print(f"pd-bench: error: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
