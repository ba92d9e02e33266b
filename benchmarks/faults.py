"""The fault table: what each fault costs on the rehearsal, with the references, in one run.

    python benchmarks/faults.py [--out-dir benchmarks/results] [--no-reference]

Runs the fault suite (tests/faults: one converged rehearsal, real supervisord, smg 1.13 and the
rehearsal engine) with PD_FAULTS_REFERENCE=1, so the same deployment also measures the references
(issue 15's smg settings; an outage longer than the grace), and writes
faults-<date>.md and faults-<date>.json (figures and every request's timeline) under --out-dir.
Figures are defined in pd_appliance.bench.faults. CPU only: it measures the appliance's control
path, not a model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

COLUMNS = [
    ("sent", "requests sent"),
    ("in_flight", "in flight at the fault"),
    ("failed_in_flight", "failed, of those in flight"),
    ("failed_after", "failed, sent after the fault"),
    ("served_after", "served, sent after the fault"),
    ("recovered_s", "recovered (s)"),
    ("fail_window_s", "failures sent until (s)"),
    ("wait_max_s", "longest answer after the fault (s)"),
    ("not_ready_s", "readiness: not ready at (s)"),
    ("ready_again_s", "ready again at (s)"),
]


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.strip()


def _machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model or platform.processor()} x{os.cpu_count()}, {platform.system()} {platform.release()}"


def _smg_version() -> str:
    smg = Path(sys.executable).parent / "smg"
    out = subprocess.run([str(smg), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def render(report: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# Faults: what each one costs (rehearsal)",
        "",
        f"Date {meta['date']}, commit `{meta['commit']}`, machine {meta['machine']}, load average before "
        f"the run {meta['loadavg']}, {meta['smg']}, rehearsal engine at 40 ms TTFT and 10 ms per token. "
        f"Command: `{meta['command']}` ({meta['wall_s']:.0f} s, pytest exit {meta['pytest_rc']}).",
        "",
        "Open-loop load through the router (16 requests/s, 48 output tokens each, streamed; 8/s for the "
        "20 s outage), the fault 3 s in; the appliance's readiness (pd_appliance.serving.readiness) looked "
        "at every 0.25 s. Times are seconds from the fault. Definitions: pd_appliance.bench.faults.",
        "",
        "| fault | " + " | ".join(title for _, title in COLUMNS) + " | errors |",
        "| --- | " + " | ".join("---" for _ in COLUMNS) + " | --- |",
    ]
    for name, figures in report.items():
        cells = [_cell(figures.get(key)) for key, _ in COLUMNS]
        errors = ", ".join(f"{kind} {count}" for kind, count in sorted(figures.get("errors", {}).items()))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {errors or '-'} |")
    order = report.get("supervisord stop + start", {}).get("start_order")
    if order:
        lines += ["", "supervisord restart, program start times from the stop (s): "
                  + ", ".join(f"{k} {v}" for k, v in order.items())]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--no-reference", action="store_true", help="the suite only, without the references")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report_file = Path(tmp) / "faults.json"
        env = {**os.environ, "PD_FAULTS_REPORT": str(report_file)}
        if not args.no_reference:
            env["PD_FAULTS_REFERENCE"] = "1"
        loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults"]
        started = time.monotonic()
        result = subprocess.run(command, cwd=ROOT, env=env, check=False)
        wall = time.monotonic() - started
        if not report_file.exists():
            print("benchmarks/faults.py: the suite wrote no figures", file=sys.stderr)
            return 1
        report = json.loads(report_file.read_text())
    now = datetime.now(timezone.utc)
    dirty = "-dirty" if _git("status", "--porcelain", "--untracked-files=no") else ""
    meta = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git("rev-parse", "--short=12", "HEAD") + dirty,
        "machine": _machine(),
        "loadavg": loadavg,
        "smg": _smg_version(),
        "command": "python benchmarks/faults.py" + (" --no-reference" if args.no_reference else ""),
        "wall_s": wall,
        "pytest_rc": result.returncode,
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"faults-{now.strftime('%Y-%m-%d')}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "faults": report}, indent=1) + "\n")
    stem.with_suffix(".md").write_text(render(report, meta))
    print(render(report, meta))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
