"""One converged rehearsal of the whole site.yml, shared by the tests that only read it or re-run it.

Three files prove different things about the same first converge: tests/foundation/test_site_modes.py
(check mode before and after, each stage tag alone), tests/security/test_secrets.py (planted secrets
reach only the env files) and tests/sglang/test_provision_rehearsal.py (what the provision stage
installed). Each used to converge a rehearsal of its own: three site-sized runs where one proves all
three. The converge is the one a user runs: `pd-appliance deploy -i <inventory>` with the router key
and Hub token on the command line (the CLI path whose records the README promises are redacted), the
supervisor's inet password in an `-e @file`, monitoring on, every port private.

tests/conftest.py hands the three files to one xdist worker together, which runs them all against the
session-scoped fixture `converged_site`; run alone, a file converges it for itself.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pd_testlib import REHEARSAL_PORTS, ROOT, ansible_env, private_artifacts, reserve_ports, run_playbook

# The files that share the converge (tests/conftest.py groups them on one xdist worker).
SHARING_FILES = (
    "tests/foundation/test_site_modes.py",
    "tests/security/test_secrets.py",
    "tests/sglang/test_provision_rehearsal.py",
)
XDIST_GROUP = "converged-site"

# Distinctive per session: a concurrent run of this suite elsewhere on the machine (another
# checkout's) plants secrets of its own, which this session's /proc sampler must not count.
_SESSION = secrets.token_hex(4)
ROUTER_KEY = f"pdsecret-router-{_SESSION}"
HF_TOKEN = f"hf_pdsecret_Hub_{_SESSION}"
INET_PASSWORD = f"pdsecret-inet-{_SESSION}"
SECRETS = (ROUTER_KEY, HF_TOKEN, INET_PASSWORD)

PORT_VARIABLES = (*REHEARSAL_PORTS, "serving_supervisor_inet_port")


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
        # `pd-appliance deploy`'s private -e file(s) seen meanwhile: path -> mode (README: 0600).
        self.extra_vars_modes: dict[str, int] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            for private in Path(tempfile.gettempdir()).glob("pd-appliance-*/extra-vars.json"):
                with contextlib.suppress(OSError):
                    self.extra_vars_modes[str(private)] = stat.S_IMODE(private.stat().st_mode)
            for proc in Path("/proc").glob("[0-9]*"):
                with contextlib.suppress(OSError):
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    user_typed = self.user_command in cmdline
                    if not user_typed and any(secret in cmdline for secret in SECRETS):
                        self.hits.append(f"{proc.name}: {cmdline[:300]}")
            self.samples += 1
            time.sleep(0.2)


@dataclass
class ConvergedSite:
    """A rehearsal converged by `pd-appliance deploy`, with what it took to get there."""

    base: Path
    inventory: Path
    artifacts: Path  # validation reports and diagnostics bundles of every run on this site
    vars_file: Path  # the secrets and artifact paths every later run passes (-e @file, 0600)
    sampler: CmdlineSampler
    runs_before: set[Path]
    fresh_check: subprocess.CompletedProcess[str] | None = None
    deploy: subprocess.CompletedProcess[str] | None = None
    started: float = field(default_factory=time.time)  # before the first play: the /tmp scan's start
    created_by_check: list[str] = field(default_factory=list)  # what the fresh check left on disk
    outputs: list[str] = field(default_factory=list)  # every play's output, for the secrets scan

    @property
    def root(self) -> Path:
        return self.base / ".rehearsal" / "root"

    @property
    def home(self) -> Path:
        return self.root / "opt" / "pd-appliance"

    def play(self, playbook: str, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
        """Run a playbook on this site with the secrets the deploy was given (a user's vars file)."""
        result = run_playbook(playbook, self.inventory, "-e", f"@{self.vars_file}", *args, timeout=timeout)
        self.outputs.append(result.stdout + result.stderr)
        return result

    def require_deploy(self) -> subprocess.CompletedProcess[str]:
        assert self.deploy is not None and self.deploy.returncode == 0, "the shared converge failed: " + (
            self.deploy.stdout[-5000:] if self.deploy else "not run"
        )
        return self.deploy


def _inventory(base: Path) -> Path:
    target = base / "inventory" / "rehearsal"
    shutil.copytree(ROOT / "inventory" / "rehearsal", target)
    ports = dict(zip((*PORT_VARIABLES, "hub"), reserve_ports(len(PORT_VARIABLES) + 1), strict=True))
    overrides: dict[str, object] = {k: v for k, v in ports.items() if k != "hub"}
    overrides.update(private_artifacts(base))
    overrides["checkpoint_hf_endpoint"] = f"http://127.0.0.1:{ports['hub']}"
    (target / "group_vars" / "all" / "zz-test-ports.yml").write_text(yaml.safe_dump(overrides))
    return target


def _deploy(site: ConvergedSite) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "pd-appliance"), "deploy", "-i", str(site.inventory)]
    site.sampler.user_command = " ".join(command)
    user = subprocess.Popen(
        [*command,
         "-e", f"serving_router_api_key={ROUTER_KEY} checkpoint_hf_token={HF_TOKEN}",
         "-e", f"@{site.vars_file}"],
        cwd=ROOT, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    stdout, _ = user.communicate(timeout=1800)
    site.outputs.append(stdout)
    return subprocess.CompletedProcess(user.args, user.returncode, stdout, "")


@contextlib.contextmanager
def converge() -> Iterator[ConvergedSite]:
    """Fresh `--check --diff`, then the converge; the stand-ins and programs stopped at the end."""
    # A short base: the supervisor socket's path must fit a unix socket (preflight checks it).
    base = Path(tempfile.mkdtemp(prefix="pdsite-", dir="/tmp"))
    inventory = _inventory(base)
    artifacts = base / "artifacts"
    vars_file = base / "user-vars.yml"
    vars_file.write_text(
        yaml.safe_dump({
            "serving_router_api_key": ROUTER_KEY,
            "checkpoint_hf_token": HF_TOKEN,
            "serving_supervisor_inet_password": INET_PASSWORD,
            "validation_artifacts_dir": str(artifacts / "validation"),
        })
    )  # fmt: skip
    vars_file.chmod(0o600)
    runs = ROOT / "artifacts" / "runs"
    site = ConvergedSite(
        base=base, inventory=inventory, artifacts=artifacts, vars_file=vars_file,
        sampler=CmdlineSampler(), runs_before=set(runs.glob("*")) if runs.exists() else set(),
    )  # fmt: skip
    site.sampler.start()
    try:
        prepared = run_playbook("standins/prepare.yml", inventory)
        assert prepared.returncode == 0, prepared.stdout[-3000:]
        site.fresh_check = site.play("site.yml", "--check", "--diff")
        site.created_by_check = [str(p) for p in (site.home / "tools", site.home / "sglang") if p.exists()]
        if site.fresh_check.returncode == 0:
            site.deploy = _deploy(site)
        yield site
    finally:
        site.sampler.stop.set()
        site.sampler.join(timeout=10)
        run_playbook("playbooks/day2/stop.yml", inventory, timeout=300)
        run_playbook("standins/cleanup.yml", inventory, timeout=120)
        shutil.rmtree(base, ignore_errors=True)
