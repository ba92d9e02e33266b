"""Secrets stay secret: planted fake secrets reach only the 0600 env files, through a whole play.

Distinctive fake secrets are given the way a user gives them: the router API key and the Hub token
with `pd-appliance deploy -e` (the CLI path whose run records the README promises are redacted), the
supervisor's inet password as a variable. Then the whole site.yml runs on a private rehearsal copy,
then the day-2 profile and collect-diagnostics playbooks. Meanwhile a sampler reads every process's
/proc/<pid>/cmdline several times a second. Afterwards every file under the copy's rehearsal root, the
run records this test created under artifacts/runs, and the test's artifacts directory (validation
reports, the diagnostics bundle unpacked) are searched for the secrets. Allowed: the programs' 0600
env files (the launcher reads them) and nothing else.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pd_testlib import ROOT, ansible_env, private_artifacts, reserve_ports, run_playbook

pytestmark = pytest.mark.slow

ROUTER_KEY = "pdsecret-router-Zq81xKp"
HF_TOKEN = "hf_pdsecret_Hub_4Wq9"
INET_PASSWORD = "pdsecret-inet-7Yh2"
SECRETS = (ROUTER_KEY, HF_TOKEN, INET_PASSWORD)


class CmdlineSampler(threading.Thread):
    """Reads /proc/*/cmdline until stopped; records every (pid, command line) that held a secret.

    The user's own `pd-appliance deploy -e key=...` process is left out: what a user types is on their
    command line before any code of the appliance runs (the README says to use vault or `-e @file`).
    Everything that process starts, and everything else, is sampled.
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.hits: list[str] = []
        self.samples = 0
        self.user_command = "\0"  # set to the start of the user's own command line

    def run(self) -> None:
        while not self.stop.is_set():
            for proc in Path("/proc").glob("[0-9]*"):
                with contextlib.suppress(OSError):
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    user_typed = self.user_command in cmdline
                    if not user_typed and any(secret in cmdline for secret in SECRETS):
                        self.hits.append(f"{proc.name}: {cmdline[:300]}")
            self.samples += 1
            time.sleep(0.2)


@pytest.fixture
def rehearsal(tmp_path: Path) -> Iterator[Path]:
    # A short base: the supervisor socket's path must fit a unix socket (preflight checks it).
    base = Path(tempfile.mkdtemp(prefix="pdsec-", dir="/tmp"))
    target = base / "inventory" / "rehearsal"
    shutil.copytree(ROOT / "inventory" / "rehearsal", target)
    names = ("serving_prefill_port", "serving_decode_port", "serving_bootstrap_port", "serving_router_port",
             "serving_router_metrics_port", "serving_supervisor_inet_port", "hub")  # fmt: skip
    ports = dict(zip(names, reserve_ports(len(names)), strict=True))
    overrides = {**{k: v for k, v in ports.items() if k != "hub"}, **private_artifacts(base)}
    overrides["checkpoint_hf_endpoint"] = f"http://127.0.0.1:{ports['hub']}"
    overrides["monitoring_enabled"] = False  # its own suite; this one is about secrets
    (target / "group_vars" / "all" / "zz-test-ports.yml").write_text(yaml.safe_dump(overrides))
    assert run_playbook("standins/prepare.yml", target).returncode == 0
    try:
        yield target
    finally:
        run_playbook("playbooks/day2/stop.yml", target, timeout=300)
        run_playbook("standins/cleanup.yml", target, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def _files_holding_secrets(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*") if root.exists() else []:
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            for secret in SECRETS:
                if secret.encode() in data:
                    found.append(f"{path} holds {secret}")
    return found


@pytest.mark.timeout(2400)
def test_planted_secrets_reach_only_the_env_files(rehearsal: Path, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    root = rehearsal.parent.parent / ".rehearsal" / "root"
    runs_before = (
        set((ROOT / "artifacts" / "runs").glob("*")) if (ROOT / "artifacts" / "runs").exists() else set()
    )
    common = {"validation_artifacts_dir": str(artifacts / "validation"),
              "serving_diagnostics_local_dir": str(artifacts / "diagnostics")}  # fmt: skip
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(yaml.safe_dump({**common, "serving_supervisor_inet_password": INET_PASSWORD}))
    sampler = CmdlineSampler()
    sampler.start()
    try:
        command = [str(Path(sys.executable).parent / "pd-appliance"), "deploy", "-i", str(rehearsal)]
        sampler.user_command = " ".join(command)
        user = subprocess.Popen(
            [*command,
             "-e", f"serving_router_api_key={ROUTER_KEY} checkpoint_hf_token={HF_TOKEN}",
             "-e", f"@{vars_file}"],
            cwd=ROOT, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        stdout, _ = user.communicate(timeout=1800)
        deploy = subprocess.CompletedProcess(user.args, user.returncode, stdout, "")
        assert deploy.returncode == 0, deploy.stdout[-5000:]
        day2_vars = tmp_path / "day2.yml"
        day2_vars.write_text(
            yaml.safe_dump(
                {
                    **common,
                    "serving_router_api_key": ROUTER_KEY,
                    "serving_supervisor_inet_password": INET_PASSWORD,
                    "serving_profile_requests": 4,
                    "serving_profile_trace_timeout_s": 30,
                }
            )
        )
        outputs = [deploy.stdout + deploy.stderr]
        for playbook in ("playbooks/day2/profile.yml", "playbooks/day2/collect-diagnostics.yml"):
            result = run_playbook(playbook, rehearsal, "-e", f"@{day2_vars}", timeout=900)
            assert result.returncode == 0, f"{playbook}: {result.stdout[-4000:]}"
            outputs.append(result.stdout + result.stderr)
    finally:
        sampler.stop.set()
        sampler.join(timeout=10)

    assert sampler.samples > 20, "the /proc sampler did not run through the play"
    assert sampler.hits == [], f"a secret was on a command line: {sampler.hits[:5]}"
    assert not [s for s in SECRETS for out in outputs if s in out], "a secret reached ansible's output"

    # The secrets did arrive where they belong: the router key in the programs' env files.
    env_files = sorted((root / "etc" / "pd-appliance" / "serving").glob("*.env"))
    assert env_files and all(ROUTER_KEY in p.read_text() for p in env_files)
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in env_files)

    bundles = list((artifacts / "diagnostics").glob("*.tar.gz"))
    assert bundles, "collect-diagnostics left no bundle"
    unpacked = tmp_path / "unpacked"
    for bundle in bundles:
        with tarfile.open(bundle) as tar:
            tar.extractall(unpacked, filter="data")
    new_runs = [p for p in (ROOT / "artifacts" / "runs").glob("*") if p not in runs_before]
    assert new_runs, "pd-appliance recorded no run"
    leaks = [
        leak
        for leak in _files_holding_secrets(root, artifacts, unpacked, *new_runs)
        if not leak.startswith(str(root / "etc" / "pd-appliance" / "serving")) or ".env holds" not in leak
    ]
    assert leaks == [], leaks
    searched = sum(1 for r in (root, artifacts, unpacked, *new_runs) for p in r.rglob("*") if p.is_file())
    print(f"searched {searched} files and {sampler.samples} /proc samples; no secret outside the env files")
