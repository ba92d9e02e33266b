"""The release rehearsal: the lab layout on this machine, driven through release changes.

Real parts: ansible-playbook with the product's roles (sglang, checkpoint, serving, validation, release),
uv installing the real sglang 0.5.23 wheel and the real patch series from a local wheelhouse, the
pd_hf_checkpoint module against the Hub stand-in (two commits), supervisord with the product's RPC
extension, smg, and the rehearsal engine. What the test sets with -e and why:

- appliance_root (a short /tmp path: supervisor's socket path must stay under 108 bytes), ports (free ones);
- a tools venv of its own (the dev venv's packages through a .pth; pip puts uv into it), the dev venv as
  router venv (smg);
- sglang_install_source=wheelhouse with a local wheelhouse, and locks reduced to what is installed without
  the CUDA stack (sglang, nixl-cu13, nixl): the release path is the lab's (the lock proven against the
  source, installed hash-checked), only without reaching PyPI for ~300 packages per venv
  (tests/sglang/test_provision_rehearsal.py proves the whole lock against PyPI);
- the pd-kernels wheel built without build isolation (the dev venv has setuptools; the sglang role builds
  it from sglang_kernels_dir as in a lab run, only without fetching setuptools from the index);
- a small validation workload.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pd_standins.sglang_wheel import build as build_standin
from pd_standins.sglang_wheel import lock_entries
from pd_testlib import ansible_env, private_artifacts, reserve_ports, run_owned, run_playbook
from rehearsal_deployment import Supervised

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLAYBOOK = ROOT / "tests" / "releases" / "release_playbook.yml"
SGLANG_VERSION = "0.5.23"
STANDIN_VERSION = "0.5.24+standin"
KEEP = ["nixl-cu13", "nixl"]
REPO_ID = "nvidia/DeepSeek-V4-Flash-NVFP4"
# A third patch for the "changed patch series" release: a comment line at the top of sglang/version.py.
EXTRA_PATCH = (
    "Release rehearsal: a third patch, so the series (and so the venv's build) changes.\n\n"
    "--- a/sglang/version.py\n+++ b/sglang/version.py\n@@ -1,3 +1,4 @@\n"
    "+# pd-appliance release rehearsal: patched by 0003 (tests/releases).\n"
    " try:\n     from sglang._version import __version__, __version_tuple__\n except ImportError:\n"
)


def wheel_dir() -> Path:
    for d in (os.environ.get("PD_WHEEL_DIR"), ROOT / "artifacts" / "wheels", "/work/wheels"):
        if d and list(Path(d).glob(f"sglang-{SGLANG_VERSION}-cp311-*.whl")):
            return Path(d)
    raise FileNotFoundError("the sglang 0.5.23 wheel is absent: make wheels")


def ensure_uv_wheel(cache: Path) -> Path:
    """uv's pinned wheel (files/locks/uv.txt, hash-checked) for the wheelhouse; downloaded once."""
    found = sorted(cache.glob("uv-*manylinux*x86_64*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes"]
        cmd += ["--only-binary=:all:", "-d", str(cache), "-r", str(ROOT / "files" / "locks" / "uv.txt")]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        found = sorted(cache.glob("uv-*manylinux*x86_64*.whl"))
    return found[0]


@dataclass
class Assets:
    """Everything the releases install from, built once: wheelhouse, locks, series, tools venv."""

    base: Path
    wheelhouse: Path
    lock_real: Path
    lock_standin: Path
    series_real: Path
    series_changed: Path
    series_standin: Path
    tools_venv: Path


def build_assets(base: Path) -> Assets:
    wheels = wheel_dir()
    python = "3.11"
    standin = build_standin(
        base / "standin",
        STANDIN_VERSION,
        ROOT / f"files/locks/sglang-{SGLANG_VERSION}/py{python}-x86_64.txt",
        KEEP,
        wheels,
        python,
    )
    wheelhouse = Path(standin["wheelhouse"])
    shutil.copy2(next(wheels.glob(f"sglang-{SGLANG_VERSION}-cp311-*.whl")), wheelhouse)
    shutil.copy2(ensure_uv_wheel(wheels), wheelhouse)
    # The real 0.5.23 lock, reduced to the packages installed without the CUDA stack.
    lock_real = base / "locks" / f"sglang-{SGLANG_VERSION}"
    lock_real.mkdir(parents=True)
    real_text = (ROOT / f"files/locks/sglang-{SGLANG_VERSION}/py{python}-x86_64.txt").read_text()
    (lock_real / f"py{python}-x86_64.txt").write_text(lock_entries(real_text, ["sglang", *KEEP]))
    manifest = json.loads((ROOT / f"files/locks/sglang-{SGLANG_VERSION}/manifest.json").read_text())
    manifest["locks"] = {python: f"py{python}-x86_64.txt"}
    (lock_real / "manifest.json").write_text(json.dumps(manifest))
    series_changed = base / "series-changed"
    shutil.copytree(ROOT / f"files/patches/sglang/{SGLANG_VERSION}", series_changed)
    (series_changed / "0099-release-rehearsal.patch").write_text(EXTRA_PATCH)
    with (series_changed / "series").open("a") as fh:
        fh.write("0099-release-rehearsal.patch\n")
    tools = base / "tools"
    subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True, timeout=120)
    [site] = tools.glob("lib/python3*/site-packages")
    dev_site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    (site / "pd-dev-venv.pth").write_text(f"import site; site.addsitedir({str(dev_site)!r})\n")
    # The dev venv's scripts the roles run from the tools venv. uv too when the dev venv has it: the
    # .pth makes pip see it as installed there, so the sglang role's `pip install uv` would add no bin/uv.
    for script in ("supervisord", "supervisorctl", "uv"):
        if (BIN / script).exists():
            (tools / "bin" / script).symlink_to(BIN / script)
    return Assets(
        base=base, wheelhouse=wheelhouse, lock_real=lock_real, lock_standin=Path(standin["lock_dir"]),
        series_real=ROOT / f"files/patches/sglang/{SGLANG_VERSION}", series_changed=series_changed,
        series_standin=Path(standin["series_dir"]), tools_venv=tools,
    )  # fmt: skip


@dataclass
class Lab(Supervised):
    """One rehearsal deployment under `root`, with the variables of the release it is asked for."""

    base: Path
    assets: Assets
    hub: Any
    inventory: Path
    variables: dict[str, Any]
    ports: dict[str, int]
    seen_pids: set[int] = field(default_factory=set)
    # The variables the lab started with: each step asks for its release from these, not from what an
    # earlier step (perhaps failed half-way) left behind.
    initial: dict[str, Any] = field(default_factory=dict)
    # The release each step's action left current (step 3: the release it failed), recorded when the
    # action ended as it should: the next step's starting state.
    reached: dict[int, str] = field(default_factory=dict)
    replayed: set[int] = field(default_factory=set)  # steps a later step replayed (at most once each)

    @property
    def root(self) -> Path:
        return Path(self.variables["appliance_root"])

    @property
    def router(self) -> str:
        return f"http://127.0.0.1:{self.ports['serving_router_port']}"

    @property
    def api_key(self) -> str:
        return (self.base / "artifacts" / "credentials" / "serving_router_api_key").read_text().strip()

    def ask_for(self, changes: dict[str, Any]) -> None:
        """Ask for the release the initial variables with `changes` describe (the whole inventory)."""
        self.variables = {**self.initial, **changes}

    def _vars_file(self) -> str:
        """The variables of the release asked for, as the -e file of the next run."""
        vars_file = self.base / "vars.json"
        vars_file.write_text(json.dumps(self.variables))
        return f"@{vars_file}"

    def play(
        self, tags: str, *extra: str, playbook: Path = PLAYBOOK, timeout: int = 900
    ) -> subprocess.CompletedProcess:
        tagged = ["--tags", tags] if tags else []
        result = run_playbook(
            playbook, self.inventory, "-e", self._vars_file(), *tagged, *extra, timeout=timeout
        )
        self.pids()
        return result

    def cli(self, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
        cmd = [str(BIN / "pd-appliance"), *args, "-i", str(self.inventory), "-e", self._vars_file()]
        result = run_owned(cmd, timeout, ansible_env())
        self.pids()
        return result

    def ask(self, prompt: str = "The capital of France is") -> tuple[int, str]:
        """One completion through the router: (status, the answering engine's X-PD-Simulator header)."""
        body = json.dumps({"model": "dsv4-flash", "prompt": prompt, "max_tokens": 4}).encode()
        request = urllib.request.Request(
            self.router + "/v1/completions", body,
            {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers.get("X-PD-Simulator", "")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("X-PD-Simulator", "") if exc.headers else ""
        except OSError:
            return 0, ""

    def worker(self, role: str, path: str) -> Any:
        port = self.ports[f"serving_{role}_port"]
        # Workers take the router's key too (serving_worker_require_api_key); /metrics needs none.
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {self.api_key}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read().decode()
        return json.loads(body) if path != "/metrics" else body

    def requests_served(self, role: str) -> float:
        """sglang:num_requests_total of the running `role` worker (SGLang's counter, the engine keeps it)."""
        text = self.worker(role, "/metrics")
        return sum(float(v) for v in re.findall(r"(?m)^sglang:num_requests_total\{[^}]*\} (\S+)$", text))

    def state(self) -> dict[str, Any]:
        return json.loads((self.root / "var/lib/pd-appliance/releases/state.json").read_text())

    def host_release(self) -> dict[str, Any]:
        """The host state's release pointers (ansible_local.pd_appliance.release)."""
        fact = json.loads((self.root / "etc/ansible/facts.d/pd_appliance.fact").read_text())
        release: dict[str, Any] = fact["release"]
        return release

    def record(self, release_id: str) -> dict[str, Any]:
        return json.loads(
            (self.root / f"var/lib/pd-appliance/releases/records/{release_id}.json").read_text()
        )

    def venvs(self) -> list[str]:
        home = self.root / "opt/pd-appliance/sglang"
        return sorted(p.name for p in home.iterdir()) if home.is_dir() else []

    def revisions(self) -> list[str]:
        models = self.root / "srv/models/DeepSeek-V4-Flash-NVFP4"
        return (
            sorted(p.name for p in models.iterdir() if re.fullmatch(r"[0-9a-f]{40}", p.name))
            if models.is_dir()
            else []
        )


def new_lab(hub: Any, assets: Assets) -> Lab:
    base = Path(tempfile.mkdtemp(prefix="pdrel-", dir="/tmp"))
    inventory = base / "inventory" / "rehearsal"
    shutil.copytree(ROOT / "inventory" / "rehearsal", inventory)
    names = ("serving_prefill_port", "serving_decode_port", "serving_bootstrap_port", "serving_router_port",
             "serving_router_metrics_port")  # fmt: skip
    ports = dict(zip(names, reserve_ports(len(names)), strict=True))
    # The appliance_tools role creates the state directory in a lab run; this test runs the sglang role alone.
    (base / "root" / "var/lib/pd-appliance").mkdir(parents=True)
    variables: dict[str, Any] = {
        **ports,
        **private_artifacts(base),
        "appliance_root": str(base / "root"),
        "appliance_tools_venv": str(assets.tools_venv),
        "appliance_router_venv": sys.prefix,
        "sglang_kernels_build_isolation": False,
        "checkpoint_hf_endpoint": hub.url,
        "checkpoint_revision": hub.repo.commit,
        "sglang_install_source": "wheelhouse",
        "sglang_wheelhouse": str(assets.wheelhouse),
        "sglang_cuda_free_packages": ["sglang", *KEEP],
        "sglang_version": SGLANG_VERSION,
        "sglang_lock_dir": str(assets.lock_real),
        "sglang_patch_series_dir": str(assets.series_real),
        "validation_artifacts_dir": str(base / "artifacts"),
        "validation_concurrency": [1, 16],
        "validation_num_requests": [3, 32],
        "validation_warmup_requests": [1, 16],
        "validation_input_len": 64,
        "validation_output_len": 64,
        "validation_ready_timeout_s": 60,
        "release_keep": 2,
        "release_keep_checkpoint_revisions": 1,
    }
    return Lab(base=base, assets=assets, hub=hub, inventory=inventory, variables=variables, ports=ports,
               initial=dict(variables))  # fmt: skip


# ---- the steps of test_release_rehearsal: actions and starting states --------------------------------
def release_changes(lab: Lab, step: int) -> dict[str, Any]:
    """The inventory changes (from the initial variables) that ask for step `step`'s release."""
    standin = {
        "sglang_version": STANDIN_VERSION,
        "sglang_lock_dir": str(lab.assets.lock_standin),
        "sglang_patch_series_dir": str(lab.assets.series_standin),
    }
    return {
        1: {},
        2: {"sglang_patch_series_dir": str(lab.assets.series_changed)},
        # decode at 60 ms a token: bs=1 makes ~16 tok/s, below the rehearsal floor of 60
        3: {**standin, "serving_env_decode": {"PD_SIM_TPOT_MS": "60"}},
        4: standin,
        5: standin,  # the rollback runs with the inventory of step 4
    }[step]


def act(lab: Lab, step: int, tags: str = "sglang,serve,validate") -> subprocess.CompletedProcess:
    """Step `step`'s action (ask for its release, run its play or command) and, when it ended as it
    should (step 3's play fails, the others succeed), record the state it left: Lab.reached[step]."""
    lab.ask_for(release_changes(lab, step))
    result = lab.cli("rollback") if step == 5 else lab.play("" if step == 1 else tags)
    state = lab.state() if (lab.root / "var/lib/pd-appliance/releases/state.json").exists() else {}
    if step == 3 and result.returncode != 0 and state.get("current") == lab.reached.get(2):
        failed = [rid for rid, r in state["releases"].items() if r["status"] == "failed"]
        if failed:
            lab.reached[3] = failed[-1]
    elif step != 3 and result.returncode == 0:
        lab.reached[step] = state["current"]
    return result


def arrive(lab: Lab, step: int) -> None:
    """Bring the lab to step `step`'s starting state: replay (once) the action of every earlier step
    that has not recorded its state. A passing run finds them all recorded and replays nothing."""
    for earlier in range(1, step):
        if earlier in lab.reached:
            continue
        if earlier in lab.replayed:  # replayed for an earlier step already, in vain: not again
            pytest.fail(f"step {step} cannot start: step {earlier}'s action failed, also when replayed")
        lab.replayed.add(earlier)
        # Step 4 as a replay installs the stand-in itself (its test relies on step 3's install).
        result = act(lab, earlier)
        if earlier not in lab.reached:
            pytest.fail(
                f"step {step} cannot start: step {earlier}'s action, replayed from the recorded state, "
                f"did not end as it should (rc={result.returncode}):\n{result.stdout[-3000:]}"
            )
