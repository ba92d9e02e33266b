"""Helpers of the serving rehearsal tests: a converged deployment, requests, and stopping it all."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pd_testlib import private_artifacts, reap, reserve_ports, run_playbook


@dataclass
class Deployment:
    root: Path
    vars_file: Path
    router: str
    first_run: subprocess.CompletedProcess

    @property
    def conf(self) -> Path:
        return self.root / "etc/pd-appliance/supervisor/supervisord.conf"

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        binary = Path(sys.executable).parent / "supervisorctl"
        return subprocess.run([str(binary), "-c", str(self.conf), *args], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip

    def pids(self) -> dict[str, int]:
        out = {}
        for line in self.ctl("status").stdout.splitlines():
            match = re.match(r"^pd:([\w-]+)\s+RUNNING\s+pid (\d+)", line)
            if match:
                out[match.group(1)] = int(match.group(2))
        return out

    def converge(self, *extra: str) -> subprocess.CompletedProcess:
        return run_playbook("playbooks/serve.yml", "inventory/rehearsal", "-e", f"@{self.vars_file}", *extra,
                            timeout=900)  # fmt: skip


# The router's (and, as smg forwards it, the workers') API key in these tests, set by -e so that no
# key is generated into the checkout's artifacts/credentials.
API_KEY = "serving-test-router-key-7d1f"


@dataclass
class Layouts:
    """A private deployment and the reserved ports its test's layouts put instances on."""

    deployment: Deployment
    ports: list[int]

    def pids(self) -> dict[str, int]:
        return self.deployment.pids()


def private_deployment(base: Path, worker_ports: int) -> tuple[Deployment, list[int]]:
    """A rehearsal deployment of its own under `base` (install root, artifacts, reserved router and
    monitoring ports: preflight checks the monitor stage's too), not converged yet, and
    `worker_ports` more reserved ports for the layout's instances."""
    router, metrics, prometheus, node, gpu, *ports = reserve_ports(5 + worker_ports)
    variables = {
        "appliance_root": str(base / "root"), "appliance_tools_venv": sys.prefix,
        "appliance_router_venv": sys.prefix, "serving_router_port": router,
        "serving_router_metrics_port": metrics, "serving_router_api_key": API_KEY, **private_artifacts(base),
        "monitoring_prometheus_port": prometheus, "monitoring_node_exporter_port": node,
        "monitoring_gpu_exporter_port": gpu,
    }  # fmt: skip
    vars_file = base / "vars.json"
    vars_file.write_text(json.dumps(variables))
    deployment = Deployment(base / "root", vars_file, f"http://127.0.0.1:{router}", None)  # type: ignore[arg-type]
    return deployment, ports


def _post(
    url: str, body: dict, timeout: float = 10, api_key: str | None = API_KEY
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _changed(result: subprocess.CompletedProcess) -> int:
    match = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)", result.stdout)
    assert match, result.stdout[-3000:]
    return int(match.group(1))


def _stop_everything(root: Path, conf: Path, started_pids: set[int]) -> None:
    """Shut supervisord down; SIGKILL only the processes this test saw it start, if they linger."""
    pidfile = root / "run/pd-appliance/supervisord.pid"
    supervisord = int(pidfile.read_text()) if pidfile.exists() else None
    binary = Path(sys.executable).parent / "supervisorctl"
    with contextlib.suppress(Exception):
        subprocess.run(
            [str(binary), "-c", str(conf), "shutdown"], capture_output=True, timeout=60, check=False
        )
    reap(started_pids | {supervisord})
