"""Failure cases on the multinode lab: a decode host that vanishes mid-run, and a bad inventory.

They run the scenario's own create.yml and destroy.yml on a second lab (prefix pdft, 10.254.78.0/24,
so a converged molecule lab on 10.254.77.0/24 is left alone) and site.yml over real SSH. They need
root, iproute2 network namespaces and openssh-server, as the molecule scenario does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "molecule" / "multinode"
HELPER = Path(__file__).resolve().parent / "netns_lab.py"
CALLBACKS = Path(__file__).resolve().parent / "plugins" / "callback"
LAB = {
    "pd_lab_name": "pdft",
    "pd_lab_subnet": "10.254.78",
    "pd_lab_dir": str(ROOT / ".rehearsal" / "multinode-faults"),
    "pd_lab_inventory_dir": str(ROOT / ".rehearsal" / "multinode-faults-inventory"),
}
HOSTS = ("mn-router", "mn-prefill", "mn-decode")


def _netns_unavailable() -> str | None:
    """Why this machine cannot run the lab, or None: the two conditions the tests skip on."""
    if os.geteuid() != 0:
        return "needs root: the lab creates network namespaces, veths, a bridge and sshds"
    probe = f"pdprobe{uuid.uuid4().hex[:6]}"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if added.returncode != 0:
        return f"`ip netns add` is not permitted here: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


pytestmark = [pytest.mark.slow]
_SKIP = _netns_unavailable()
needs_netns = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(
        {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    )
    env.update(extra)
    return env


def playbook(
    path: Path, inventory: str, *args: str, env: dict[str, str] | None = None, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook from this venv with the lab's -e overrides; never raises on rc."""
    binary = Path(sys.executable).parent / "ansible-playbook"
    cmd = [str(binary), str(path), "-i", inventory, "-e", json.dumps(LAB), *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env or _env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def lab_status() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HELPER), "status", f"--name={LAB['pd_lab_name']}", f"--dir={LAB['pd_lab_dir']}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def appliance_roots() -> dict[str, Path]:
    return {host: Path(LAB["pd_lab_dir"]) / "hosts" / host / "root" for host in HOSTS}


def create_lab() -> None:
    created = playbook(SCENARIO / "create.yml", LAB["pd_lab_inventory_dir"])
    assert created.returncode == 0, created.stdout[-4000:] + created.stderr[-2000:]


def destroy_lab() -> subprocess.CompletedProcess[str]:
    return playbook(SCENARIO / "destroy.yml", LAB["pd_lab_inventory_dir"])


def assert_nothing_left() -> None:
    status = lab_status()
    assert status["namespaces"] == {}, status
    assert status["links"] == [], status
    assert not status["dir_exists"], status
    assert status["stray_processes"] == [], status
    assert not Path(LAB["pd_lab_inventory_dir"]).exists()


@pytest.fixture
def lab() -> Iterator[None]:
    """A fresh lab for one test; destroyed afterwards (also when create fails), leaving nothing."""
    try:
        create_lab()
        yield
    finally:
        destroyed = destroy_lab()
        assert destroyed.returncode == 0, destroyed.stdout[-4000:]
        assert_nothing_left()


def play_of(output: str, marker: str) -> str | None:
    """The name of the play (stage) whose section of ansible-playbook's output holds `marker`."""
    current = None
    for line in output.splitlines():
        header = re.match(r"^PLAY \[(.*)\] \*+", line)
        if header:
            current = header.group(1)
        elif marker in line:
            return current
    return None


@needs_netns
def test_bad_inventory_stops_in_preflight_before_any_change(lab: None, tmp_path: Path) -> None:
    """A decode GPU the host does not have: site.yml stops in Preflight, nothing is created."""
    assert not any(root.exists() for root in appliance_roots().values()), "the lab must start clean"
    # The lab's inventory, with one mistake a user makes: a GPU index beyond the host's 8 GPUs.
    inventory = yaml.safe_load((Path(LAB["pd_lab_inventory_dir"]) / "hosts.yml").read_text())
    inventory["pd_appliance"]["hosts"]["mn-decode"]["serving_decode_gpus"] = [0, 1, 2, 9]
    bad = Path(LAB["pd_lab_inventory_dir"]) / "hosts.yml"
    bad.write_text(yaml.safe_dump(inventory, sort_keys=False))
    pids_before = {ns: set(p) for ns, p in lab_status()["namespaces"].items()}

    result = playbook(ROOT / "site.yml", LAB["pd_lab_inventory_dir"])
    output = result.stdout + result.stderr

    assert result.returncode != 0, output[-4000:]
    assert "mn-decode: serving_decode_gpus=[0, 1, 2, 9] names GPU [9]" in output, output[-4000:]
    assert play_of(output, "Preflight found") is not None
    assert play_of(output, "Preflight found").startswith("Preflight"), output[-4000:]
    started = re.findall(r"^PLAY \[(.*?)\]", output, flags=re.MULTILINE)
    assert all(name.startswith("Preflight") for name in started), started
    assert re.search(r"^mn-\w+\s+:.*changed=0 ", output, flags=re.MULTILINE), output[-2000:]
    assert not re.search(r"^mn-\w+\s+:.*changed=[1-9]", output, flags=re.MULTILINE), output[-2000:]
    for host, root in appliance_roots().items():
        assert not root.exists(), f"{host}: preflight failed, yet {root} was created"
    # Nothing was started on any host: each namespace holds only its sshd, as before the run.
    pids_after = {ns: set(p) for ns, p in lab_status()["namespaces"].items()}
    assert pids_after == pids_before


@needs_netns
def test_decode_host_gone_mid_run_is_reported_with_host_and_stage(lab: None) -> None:
    """The decode host's link and sshd go away mid-run: the run names the host and the stage.

    The fault strikes when the first Provision play starts (preflight has passed on every host),
    which keeps the test to about a minute; PD_LAB_FAULT_PLAY=Serve moves it to the serve stage at
    the cost of a full provision and checkpoint first.
    """
    fault = [sys.executable, str(HELPER), "cut", f"--name={LAB['pd_lab_name']}", f"--dir={LAB['pd_lab_dir']}"]
    env = _env(
        ANSIBLE_CALLBACK_PLUGINS=str(CALLBACKS),
        ANSIBLE_CALLBACKS_ENABLED="pd_lab_fault",
        PD_LAB_FAULT_PLAY=os.environ.get("PD_LAB_FAULT_PLAY", "Provision"),
        PD_LAB_FAULT_COMMAND=json.dumps([*fault, "--host=mn-decode"]),
        # An operator's "stop everything when a host fails": the run ends in the stage that lost
        # the host, instead of going on with the other two for minutes.
        ANSIBLE_ANY_ERRORS_FATAL="True",
    )
    if not env["PD_LAB_FAULT_PLAY"].startswith("Provision"):
        # Stages past provision need the hosts' wheelhouse (a cache: fast once filled).
        prepared = playbook(SCENARIO / "prepare.yml", LAB["pd_lab_inventory_dir"])
        assert prepared.returncode == 0, prepared.stdout[-4000:]
    # The router must not wait the production 30-60 min for a decode worker that never comes.
    quick = json.dumps({"serving_health_timeout_s": 20, "serving_router_wait_for_workers_timeout_s": 20})
    result = playbook(ROOT / "site.yml", LAB["pd_lab_inventory_dir"], "-e", quick, env=env)
    output = result.stdout + result.stderr

    assert result.returncode != 0, output[-4000:]
    assert "PD_LAB_FAULT at the start of play" in output, output[-4000:]
    stage = play_of(output, "fatal: [mn-decode]: UNREACHABLE!")
    assert stage is not None, output[-4000:]
    assert stage.startswith(env["PD_LAB_FAULT_PLAY"]), f"mn-decode reported unreachable in {stage!r}"
    recap = re.search(r"^mn-decode\s+:.*unreachable=(\d+)", output, flags=re.MULTILINE)
    assert recap and int(recap.group(1)) >= 1, output[-2000:]
    # Before the fault the decode host took part: it passed preflight like the others.
    assert (play_of(output, "ok: [mn-decode]") or "").startswith("Preflight"), output[:4000]


@needs_netns
def test_destroy_is_safe_when_nothing_exists() -> None:
    """destroy.yml on a lab that was never created: succeeds, changes nothing, twice."""
    assert not lab_status()["namespaces"], "a pdft lab exists already; destroy it first"
    for _ in range(2):
        result = destroy_lab()
        assert result.returncode == 0, result.stdout[-3000:]
        assert re.search(r"^localhost\s+:.*changed=0 ", result.stdout, flags=re.MULTILINE), result.stdout[
            -2000:
        ]
    assert_nothing_left()
