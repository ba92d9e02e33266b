"""Run the GPU exporter once on a real GPU and keep what NVML said, what it scraped and nvidia-smi's view.

Run on the lent GPU (device tool), from the repository root, while the GPU is busy:

    PYTHONPATH=src:tests/monitoring python3 tests/monitoring/record_gpu_exporter.py \
        --assign decode:decode=0 --out "$OUT/gpu_exporter_h200.json"

The record holds the date, the GPU, the driver, every NVML call and answer, the exporter's scrape
built from those answers, and nvidia-smi's CSV taken right after. test_gpu_exporter.py replays the
calls through ReplayNvml and checks the scrape against nvidia-smi.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

import pynvml
from nvml_record import RecordingNvml

from pd_appliance.monitoring.gpu_exporter import GpuCollector, parse_assignments, scrape_once

SMI_FIELDS = (
    "index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,power.draw,power.limit,"
    "temperature.gpu,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.gen.max,"
    "pcie.link.width.current,pcie.link.width.max,utilization.gpu"
)


def _smi() -> str:
    done = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout + done.stderr


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--assign", action="append", default=[])
    p.add_argument("--out", required=True)
    p.add_argument("--scrapes", type=int, default=2)
    args = p.parse_args()
    recorder = RecordingNvml(pynvml)
    collector = GpuCollector(recorder, parse_assignments(args.assign))
    scrapes = []
    for _ in range(args.scrapes):
        start = len(recorder.calls)
        scrapes.append({"first_call": start, "text": scrape_once(collector).decode()})
    smi = _smi()
    pynvml.nvmlShutdown()
    record = {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "nvidia_ml_py": getattr(pynvml, "__version__", "unknown"),
        "assign": args.assign,
        "calls": recorder.calls,
        "scrapes": scrapes,
        "nvidia_smi_csv": smi,
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(scrapes[-1]["text"])
    print(smi)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
