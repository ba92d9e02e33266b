"""The fault suite's deployment handle (a module of its own: `from conftest import` is ambiguous)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pd_appliance.serving.apply import connect
from pd_appliance.serving.readiness import check
from pd_testlib import run_playbook


@dataclass
class Deployment:
    root: Path
    vars_file: Path
    router: str
    api_key: str
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
        return bool(check(self.router, self.api_key, timeout_s=5)["ready"])

    def wait_ready(self, timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = check(self.router, self.api_key, timeout_s=5)
            if result["ready"] or time.monotonic() > deadline:
                return result
            time.sleep(0.25)
