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
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pd_appliance.serving.apply import connect
from pd_appliance.serving.readiness import check
from pd_testlib import free_ports, run_playbook


@dataclass
class Deployment:
    root: Path
    vars_file: Path
    router: str
    seen_pids: set[int] = field(default_factory=set)

    @property
    def conf(self) -> Path:
        return self.root / "etc/pd-appliance/supervisor/supervisord.conf"

    @property
    def serverurl(self) -> str:
        return f"unix://{self.root}/run/pd-appliance/supervisor.sock"

    @property
    def start_command(self) -> list[str]:
        """How the serving role starts supervisord without systemd (serving_supervisor_manager=direct)."""
        return [str(Path(sys.executable).parent / "supervisord"), "-c", str(self.conf)]

    def programs(self) -> dict[str, dict[str, Any]]:
        infos = connect(self.serverurl).supervisor.getAllProcessInfo()
        programs = {i["name"]: i for i in infos if i["group"] == "pd"}
        self.seen_pids |= {i["pid"] for i in programs.values() if i["pid"]}
        return programs

    def converge(self, *extra: str) -> subprocess.CompletedProcess:
        args = ("-e", f"@{self.vars_file}", *extra)
        result = run_playbook("playbooks/serve.yml", "inventory/rehearsal", *args, timeout=900)
        with contextlib.suppress(OSError):
            self.programs()
        return result

    def ready(self) -> bool:
        return bool(check(self.router, timeout_s=5)["ready"])

    def wait_ready(self, timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = check(self.router, timeout_s=5)
            if result["ready"] or time.monotonic() > deadline:
                return result
            time.sleep(0.25)


def _changed(result: subprocess.CompletedProcess) -> int:
    match = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", result.stdout)
    return int(match.group(1)) if match else -1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


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
    candidates = {p for p in dep.seen_pids | {supervisord} if p}
    deadline = time.monotonic() + 60
    while candidates and time.monotonic() < deadline:
        candidates = {p for p in candidates if _alive(p)}
        time.sleep(0.5)
    for pid in candidates:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="package")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    base = tmp_path_factory.mktemp("faults")
    root = base / "root"
    prefill, decode, bootstrap, router, metrics = free_ports(5)
    variables = {
        "appliance_root": str(root), "appliance_tools_venv": sys.prefix, "appliance_router_venv": sys.prefix,
        "serving_prefill_port": prefill, "serving_decode_port": decode, "serving_bootstrap_port": bootstrap,
        "serving_router_port": router, "serving_router_metrics_port": metrics,
    }  # fmt: skip
    vars_file = base / "vars.json"
    vars_file.write_text(json.dumps(variables))
    dep = Deployment(root, vars_file, f"http://127.0.0.1:{router}")
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
