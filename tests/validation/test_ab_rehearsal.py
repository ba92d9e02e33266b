"""A/B through the real serving role in rehearsal: supervisord, two pd-sim-worker programs, smg.

serve.yml deploys; validate.yml measures the deployed configuration and one env-hook variant
(decode's simulated per-token time halved), adopts the faster, and leaves it running; only
pd:decode restarts, and the adopted variant is in the report and on the host.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pd_testlib import run_playbook

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def uptimes(config: Path) -> dict[str, str]:
    status = subprocess.run(
        [str(BIN / "supervisorctl"), "-c", str(config), "status"], capture_output=True, text=True, check=False
    ).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r"^(pd:\w+)\s+RUNNING\s+pid (\d+)", status, re.M)}


def test_variant_adopted_and_only_decode_restarted(tmp_path: Path, rehearsal_inventory_copy: Path) -> None:
    prefill, decode, bootstrap, router, metrics = free_ports(5)
    venv = str(BIN.parent)
    # supervisord's unix socket path must stay under ~108 bytes: pytest's tmp_path is too deep.
    run_dir = tempfile.mkdtemp(prefix="pdv-", dir="/tmp")
    common = {
        "serving_supervisor_run_dir": run_dir,
        "appliance_tools_venv": venv,
        "appliance_router_venv": venv,
        "serving_prefill_port": prefill,
        "serving_decode_port": decode,
        "serving_bootstrap_port": bootstrap,
        "serving_router_port": router,
        "serving_router_metrics_port": metrics,
    }
    root = rehearsal_inventory_copy.parent.parent / ".rehearsal" / "root"
    config = root / "etc" / "pd-appliance" / "supervisor" / "supervisord.conf"
    try:
        served = run_playbook("playbooks/serve.yml", rehearsal_inventory_copy, "-e", json.dumps(common))
        assert served.returncode == 0, served.stdout[-3000:]
        before = uptimes(config)
        assert set(before) == {"pd:prefill", "pd:decode", "pd:router"}
        variant = {"name": "decode-fast", "description": "decode at 1 ms/token",
                   "env_hooks": {"decode": {"PD_SIM_TPOT_MS": "1"}}}  # fmt: skip
        extra = common | {
            "validation_variants": [variant],
            "validation_adopt_fastest": True,
            "validation_artifacts_dir": str(tmp_path / "artifacts"),
            "validation_num_requests": [4, 32],
        }
        validated = run_playbook("playbooks/validate.yml", rehearsal_inventory_copy, "-e", json.dumps(extra))
        assert validated.returncode == 0, validated.stdout[-3000:]
        after = uptimes(config)
        # Only decode's environment changed, so only decode has a new pid.
        assert after["pd:prefill"] == before["pd:prefill"] and after["pd:router"] == before["pd:router"]
        assert after["pd:decode"] != before["pd:decode"]
        report = json.loads((tmp_path / "artifacts" / "report.json").read_text())
        assert report["selected_variant"] == "decode-fast" and report["passed"]
        assert report["selection"]["fastest"] == "decode-fast"
        assert [v["variant"] for v in report["variants"]] == ["deployed", "decode-fast"]
        tpot = {v["variant"]: v["phases"][0]["tpot_ms"]["p50"] for v in report["variants"]}
        assert tpot["decode-fast"] < tpot["deployed"]  # bs=1: 1 ms vs 2 ms per token in the simulator
        assert report["final_probe"]["passed"] is True
        adopted = json.loads(
            (root / "var" / "lib" / "pd-appliance" / "validation" / "adopted_variant.json").read_text()
        )
        assert adopted["name"] == "decode-fast"
        assert adopted["env_hooks"] == {"decode": {"PD_SIM_TPOT_MS": "1"}}
        env = (root / "etc" / "pd-appliance" / "supervisor" / "conf.d" / "decode.conf").read_text()
        assert 'PD_SIM_TPOT_MS="1"' in env
    finally:
        if config.exists():
            subprocess.run(
                [str(BIN / "supervisorctl"), "-c", str(config), "shutdown"], check=False, timeout=60
            )
        shutil.rmtree(run_dir, ignore_errors=True)
