"""A private rehearsal deployment for the tests that serve: its own install root, artifacts and
reserved ports, converged by playbooks/serve.yml against inventory/rehearsal, stopped whole at the
end (supervisord shut down, then SIGKILL for what this test saw it start and still lingers).

The serving, topology, aggregated and fault suites all use this one handle; its supervisord half
(Supervised) is the release rehearsal's Lab's too.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import xmlrpc.client
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pd_appliance.serving.apply import connect
from pd_appliance.serving.polling import poll
from pd_appliance.serving.readiness import check
from pd_testlib import private_artifacts, reap, reserve_ports, run_playbook

# The router's (and, as smg forwards it, the workers') API key in these tests, set by -e so that no
# key is generated into the checkout's artifacts/credentials.
API_KEY = "serving-test-router-key-7d1f"
# The single PD pair's ports (the lab inventory's default layout reads these variables).
PD_PORTS = ("serving_prefill_port", "serving_decode_port", "serving_bootstrap_port")


class Supervised:
    """A private install root's supervisord, as the serving role lays it out under `root`: reached by
    supervisorctl and XML-RPC, and stopped whole. The serving suites' Deployment and the release
    rehearsal's Lab are both one; a subclass gives `root` and a `seen_pids` set."""

    root: Path
    seen_pids: set[int]

    @property
    def conf(self) -> Path:
        return self.root / "etc/pd-appliance/supervisor/supervisord.conf"

    @property
    def serverurl(self) -> str:
        return f"unix://{self.root}/run/pd-appliance/supervisor.sock"

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        binary = Path(sys.executable).parent / "supervisorctl"
        return subprocess.run([str(binary), "-c", str(self.conf), *args], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip

    def programs(self) -> dict[str, dict[str, Any]]:
        """supervisor's view of group pd by program name (XML-RPC); remembers every pid seen, any group."""
        infos = connect(self.serverurl).supervisor.getAllProcessInfo()
        self.seen_pids |= {i["pid"] for i in infos if i["pid"]}
        programs = {i["name"]: i for i in infos if i["group"] == "pd"}
        return programs

    def pids(self) -> dict[str, int]:
        """The RUNNING programs' pids by name; {} when supervisord does not answer."""
        try:
            programs = self.programs()
        except (OSError, xmlrpc.client.Fault):
            return {}
        return {name: int(info["pid"]) for name, info in programs.items() if info["statename"] == "RUNNING"}

    def stop(self) -> None:
        """Shut supervisord down; SIGKILL only the processes this test saw it start, if they linger."""
        self.pids()
        pidfile = self.root / "run/pd-appliance/supervisord.pid"
        supervisord = int(pidfile.read_text()) if pidfile.exists() else None
        if self.conf.exists():
            with contextlib.suppress(Exception):
                self.ctl("shutdown")
        reap(self.seen_pids | {supervisord})


@dataclass
class Deployment(Supervised):
    """Where one private deployment lives, how to reach it, and every program pid it was seen run."""

    root: Path
    vars_file: Path
    router: str
    api_key: str = API_KEY
    first_run: subprocess.CompletedProcess | None = None
    seen_pids: set[int] = field(default_factory=set)

    @property
    def start_command(self) -> list[str]:
        """How the serving role starts supervisord without systemd (serving_supervisor_manager=direct)."""
        return [str(Path(sys.executable).parent / "supervisord"), "-c", str(self.conf)]

    def play(self, playbook: str, *extra: str) -> subprocess.CompletedProcess:
        """A playbook of the checkout against the rehearsal with this deployment's variables."""
        result = run_playbook(
            playbook, "inventory/rehearsal", "-e", f"@{self.vars_file}", *extra, timeout=900
        )
        self.pids()
        return result

    def converge(self, *extra: str) -> subprocess.CompletedProcess:
        return self.play("playbooks/serve.yml", *extra)

    def ready(self) -> bool:
        return bool(check(self.router, self.api_key, timeout_s=5)["ready"])

    def wait_ready(self, timeout_s: float = 60) -> dict[str, Any]:
        look = lambda: check(self.router, self.api_key, timeout_s=5)  # noqa: E731
        return poll(look, lambda result: bool(result["ready"]), timeout_s, 0.25).seen


def private_deployment(
    base: Path,
    worker_ports: int = 0,
    named_ports: Sequence[str] = (),
    api_key: str = API_KEY,
    variables: Mapping[str, object] | None = None,
) -> tuple[Deployment, list[int]]:
    """A deployment of its own under `base`, not converged yet: install root, artifacts, reserved
    router, host gate and monitoring ports (preflight checks the monitor stage's too), a reserved port for
    each variable in `named_ports`, `worker_ports` more reserved ports for the test's layouts, and
    the test's own `variables`."""
    router, metrics, prometheus, node, gpu, gate, gate_metrics, *ports = reserve_ports(
        7 + len(named_ports) + worker_ports
    )
    everything = {
        "appliance_root": str(base / "root"), "appliance_tools_venv": sys.prefix,
        "appliance_router_venv": sys.prefix, "serving_router_port": router,
        "serving_router_metrics_port": metrics, "serving_router_api_key": api_key, **private_artifacts(base),
        "monitoring_prometheus_port": prometheus, "monitoring_node_exporter_port": node,
        "monitoring_gpu_exporter_port": gpu, "serving_fleet_gate_port": gate,
        "serving_fleet_gate_metrics_port": gate_metrics, **dict(zip(named_ports, ports, strict=False)),
        **(variables or {}),
    }  # fmt: skip
    vars_file = base / "vars.json"
    vars_file.write_text(json.dumps(everything))
    deployment = Deployment(base / "root", vars_file, f"http://127.0.0.1:{router}", api_key)
    return deployment, ports[len(named_ports) :]
