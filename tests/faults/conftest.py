"""One rehearsal deployment for the fault suite: playbooks/serve.yml on free loopback ports.

Real supervisord, real smg 1.13 and the rehearsal engine, converged by the serving role with the
product defaults (inventory/rehearsal, private appliance_root, this venv as tools and router venv).
Every process started is stopped at the end, also on failure. With PD_FAULTS_REPORT=<file> the
figures of every fault are written there (benchmarks/faults.py renders the table).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rehearsal_deployment import PD_PORTS, Deployment, private_deployment

API_KEY = "fault-suite-router-key"


@pytest.fixture(scope="package")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    # The router's API key (the lab generates one on the controller): clients and readiness send it.
    dep, _ = private_deployment(tmp_path_factory.mktemp("faults"), named_ports=PD_PORTS, api_key=API_KEY)
    try:
        first = dep.converge()
        assert first.returncode == 0, first.stdout[-5000:]
        yield dep
    finally:
        dep.stop()


@pytest.fixture(scope="session")
def fault_report() -> dict[str, Any]:
    """Figures per fault; written to $PD_FAULTS_REPORT at the end of the session when set."""
    report: dict[str, Any] = {}
    yield report
    target = os.environ.get("PD_FAULTS_REPORT")
    if target and report:
        Path(target).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
