"""pd-bench's own ceiling, and its agreement with SGLang's bench_serving on the same server.

    python benchmarks/bench_client_overhead.py [--sglang-python /path/to/venv/bin/python] \
        [--sglang-src /work/sglang-src] [--markdown benchmarks/results/bench_client_overhead.md]

1. Ceiling: the OpenAI test double (tests/bench/openai_stream_double.py) streams with no delay
   at all, in its own process; pd-bench runs C=16 against it. Reported: the output tok/s the
   client sustained and its CPU time per token (so the ceiling of one client core is
   1 / that, whatever the server could do), and the server's CPU time, to tell who was the limit.
2. Agreement: the same double paced like a model (default TTFT 50 ms, 20 ms per token), fresh for each
   client, measured by pd-bench and by SGLang 0.5.23's own bench_serving (run from the pinned
   wheel through benchmarks/sglang_bench_serving_shim.py) with the same workload; plus the
   figures computed independently from the server's own timestamps of the pd-bench run.
   Runs alternate (pd-bench, sglang, pd-bench, sglang) so load drift hits both.

CPU-only (no GPU involved): it measures the client, not a model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = ROOT / "tests" / "bench" / "openai_stream_double.py"
SHIM = ROOT / "benchmarks" / "sglang_bench_serving_shim.py"
sys.path.insert(0, str(ROOT / "src"))

from pd_appliance.bench.runner import measure_sync, plan_from_lists  # noqa: E402


class Double:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(DOUBLE), "--port", "0", *args], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def records(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/server_records", timeout=30) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def ceiling(concurrency: int, requests: int, output_len: int) -> dict[str, Any]:
    double = Double()
    try:
        plan = plan_from_lists(
            double.url, [concurrency], [requests], 32, output_len, None, model="double-model"
        )
        server_cpu0, cpu0, t0 = double.cpu_s(), time.process_time(), time.perf_counter()
        result = measure_sync(plan)
        client_cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        server_cpu = double.cpu_s() - server_cpu0
    finally:
        double.stop()
    phase = result["phases"][0]
    tokens_all = (requests + concurrency) * output_len + 16  # measured + warm-up + probe
    return {
        "concurrency": concurrency,
        "requests": requests,
        "output_len": output_len,
        "errors": phase["errors"],
        "output_tok_s": phase["output_tok_s"],
        "client_cpu_us_per_token": client_cpu / tokens_all * 1e6,
        "client_core_ceiling_tok_s": tokens_all / client_cpu,
        "client_cpu_share": client_cpu / wall,
        "server_cpu_share": server_cpu / wall,
    }


def server_side_figures(records: list[dict[str, Any]], measured: int) -> dict[str, float]:
    """bench_serving's figures from the server's own timestamps (the last `measured` requests)."""
    rows = records[-measured:]
    start = min(r["received"] for r in rows)
    end = max(r["chunk_times"][-1] for r in rows)
    ttfts = [r["chunk_times"][0] - r["received"] for r in rows]
    tpots = [(r["chunk_times"][-1] - r["chunk_times"][0]) / (r["tokens"] - 1) for r in rows]
    itls = [b - a for r in rows for a, b in zip(r["chunk_times"], r["chunk_times"][1:], strict=False)]
    return {
        "output_throughput": sum(r["tokens"] for r in rows) / (end - start),
        "median_ttft_ms": statistics.median(ttfts) * 1000,
        "median_tpot_ms": statistics.median(tpots) * 1000,
        "median_itl_ms": statistics.median(itls) * 1000,
    }


def run_pd_bench(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    double = Double("--ttft-ms", str(args.agree_ttft_ms), "--tpot-ms", str(args.agree_tpot_ms))
    try:
        plan = plan_from_lists(
            double.url, [args.concurrency], [args.requests], args.input_len, args.agree_output_len, None,
            model="double-model",
        )  # fmt: skip
        phase = measure_sync(plan)["phases"][0]
        server = server_side_figures(double.records(), args.requests)
    finally:
        double.stop()
    figures = {
        "output_throughput": phase["output_tok_s"],
        "median_ttft_ms": phase["ttft_ms"]["p50"],
        "p99_ttft_ms": phase["ttft_ms"]["p99"],
        "median_tpot_ms": phase["tpot_ms"]["p50"],
        "median_itl_ms": phase["itl_ms"]["p50"],
        "errors": phase["errors"],
    }
    return figures, server


def run_sglang(args: argparse.Namespace) -> dict[str, float]:
    double = Double("--ttft-ms", str(args.agree_ttft_ms), "--tpot-ms", str(args.agree_tpot_ms))
    out = Path(tempfile.mkdtemp()) / "sglang.jsonl"
    try:
        cmd = [
            args.sglang_python, str(SHIM), args.sglang_src, "--backend", "sglang-oai",
            "--base-url", double.url,
            "--dataset-name", "random-ids", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.agree_output_len), "--random-range-ratio", "1",
            "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
            "--warmup-requests", str(args.concurrency), "--output-file", str(out), "--disable-tqdm",
        ]  # fmt: skip
        subprocess.run(
            cmd, check=True, capture_output=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600
        )
    finally:
        double.stop()
    result = json.loads(out.read_text().splitlines()[-1])
    keys = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms")
    return {k: float(result[k]) for k in keys} | {"errors": args.requests - int(result["completed"])}


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def markdown(
    ceilings: list[dict[str, Any]], agreement: list[dict[str, Any]], args: argparse.Namespace
) -> str:
    lines = [
        "# pd-bench client: ceiling and agreement with SGLang bench_serving",
        "",
        f"Date {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}, commit `{_commit()}`, CPU {_cpu_model()} "
        f"x{os.cpu_count()} (no GPU: this measures the client), load average before the run "
        f"{args.load_before}. Command: `python benchmarks/bench_client_overhead.py"
        f"{' --sglang-python ...' if args.sglang_python else ''}`.",
        "",
        "## Ceiling: C=16 against a server that streams as fast as it can",
        "",
        "Client and server (tests/bench/openai_stream_double.py, no delays) share this machine's cores.",
        "",
        "| C | requests x output tokens | errors | output tok/s sustained | client CPU us/token "
        "| one client core's ceiling (tok/s) | client CPU share | server CPU share |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in ceilings:
        lines.append(
            f"| {c['concurrency']} | {c['requests']} x {c['output_len']} | {c['errors']} | "
            f"{c['output_tok_s']:.0f} | "
            f"{c['client_cpu_us_per_token']:.1f} | {c['client_core_ceiling_tok_s']:.0f} | "
            f"{c['client_cpu_share']:.0%} | {c['server_cpu_share']:.0%} |"
        )
    if agreement:
        lines += [
            "",
            f"## Agreement on the same paced server (TTFT {args.agree_ttft_ms:g} ms, "
            f"{args.agree_tpot_ms:g} ms/token), C={args.concurrency}, "
            f"{args.requests} requests, {args.input_len} in / {args.agree_output_len} out",
            "",
            "pd-bench and SGLang 0.5.23 `bench_serving` (`--backend sglang-oai --dataset-name random-ids "
            "--random-range-ratio 1`, run from the pinned wheel through "
            "benchmarks/sglang_bench_serving_shim.py), each against a fresh server process; 'server' is "
            "computed from the server's own timestamps of the pd-bench run. Diff = pd-bench vs SGLang "
            "of the same round.",
            "",
            "| round | figure | pd-bench | SGLang bench_serving | diff | server timestamps |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for i, row in enumerate(agreement, start=1):
            for key in (
                "output_throughput",
                "median_ttft_ms",
                "p99_ttft_ms",
                "median_tpot_ms",
                "median_itl_ms",
            ):
                ours, theirs = row["pd_bench"][key], row["sglang"].get(key) if row["sglang"] else None
                server = row["server"].get(key)
                diff = f"{(ours - theirs) / theirs:+.1%}" if theirs else "-"
                lines.append(
                    f"| {i} | {key} | {ours:.2f} | {'-' if theirs is None else f'{theirs:.2f}'} | "
                    f"{diff} | {'-' if server is None else f'{server:.2f}'} |"
                )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=1024, help="tokens per request for the ceiling")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--agree-output-len", type=int, default=128)
    parser.add_argument("--agree-ttft-ms", type=float, default=50.0, help="paced server: time to first token")
    parser.add_argument("--agree-tpot-ms", type=float, default=20.0, help="paced server: time per token")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--sglang-python", help="python of a venv with transformers+tokenizers (see the shim)"
    )
    parser.add_argument("--sglang-src", default="/work/sglang-src", help="the extracted sglang 0.5.23 wheel")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    args.load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    ceilings = [ceiling(args.concurrency, args.requests, args.output_len) for _ in range(2)]
    print(json.dumps(ceilings, indent=2))
    agreement = []
    for _ in range(args.rounds):
        ours, server = run_pd_bench(args)
        theirs = run_sglang(args) if args.sglang_python else None
        agreement.append({"pd_bench": ours, "sglang": theirs, "server": server})
        print(json.dumps(agreement[-1], indent=2))
    text = markdown(ceilings, agreement, args)
    if args.markdown:
        args.markdown.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
