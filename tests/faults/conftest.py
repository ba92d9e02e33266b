"""One rehearsal deployment for the fault suite: playbooks/serve.yml on free loopback ports.

Real supervisord, real smg 1.13 and the rehearsal engine, converged by the serving role with the
product defaults (inventory/rehearsal, private appliance_root, this venv as tools and router venv).
Every process started is stopped at the end, also on failure. With PD_FAULTS_REPORT=<file> the
figures of every fault are written there (benchmarks/faults.py renders the table).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fault_deployment import Deployment

from pd_testlib import private_artifacts, reap, reserve_ports

API_KEY = "fault-suite-router-key"


def _stop_everything(dep: Deployment) -> None:
    """Shut supervisord down; SIGKILL only the processes this suite saw it start, if they linger."""
    with contextlib.suppress(Exception):
        dep.programs()
    pidfile = dep.root / "run/pd-appliance/supervisord.pid"
    supervisord = int(pidfile.read_text()) if pidfile.exists() else None
    binary = Path(sys.executable).parent / "supervisorctl"
    with contextlib.suppress(Exception):
        subprocess.run(
            [str(binary), "-c", str(dep.conf), "shutdown"], capture_output=True, timeout=90, check=False
        )
    reap(dep.seen_pids | {supervisord})


@pytest.fixture(scope="package")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    base = tmp_path_factory.mktemp("faults")
    root = base / "root"
    prefill, decode, bootstrap, router, metrics = reserve_ports(5)
    variables = {
        "appliance_root": str(root), "appliance_tools_venv": sys.prefix, "appliance_router_venv": sys.prefix,
        "serving_prefill_port": prefill, "serving_decode_port": decode, "serving_bootstrap_port": bootstrap,
        "serving_router_port": router, "serving_router_metrics_port": metrics,
        # The router's API key (the lab generates one on the controller): clients and readiness send it.
        "serving_router_api_key": API_KEY, **private_artifacts(base),
    }  # fmt: skip
    vars_file = base / "vars.json"
    vars_file.write_text(json.dumps(variables))
    dep = Deployment(root, vars_file, f"http://127.0.0.1:{router}", API_KEY)
    try:
        first = dep.converge()
        assert first.returncode == 0, first.stdout[-5000:]
        yield dep
    finally:
        _stop_everything(dep)


@pytest.fixture(scope="session")
def fault_report() -> dict[str, Any]:
    """Figures per fault; written to $PD_FAULTS_REPORT at the end of the session when set."""
    report: dict[str, Any] = {}
    yield report
    target = os.environ.get("PD_FAULTS_REPORT")
    if target and report:
        Path(target).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
