"""Failure cases on fresh container lab hosts: a bad inventory, a host lost mid-run, destroy on nothing.

They run the container lab's own create.yml/destroy.yml (tests/containers/) with the two-host
inventory of molecule/multinode, moved to a lab of their own (containers pdlab-faults-*, network
10.254.81.128/25) so that a converged multinode lab on 10.254.81.0/25 is left alone, and site.yml
over real SSH. Every lab is destroyed afterwards, also when the test fails, and the finalizer
checks that no container or network of it is left. They need root and a running dockerd.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pd_testlib import ROOT, ansible_env, run_owned, run_playbook

HERE = Path(__file__).resolve().parent
SCENARIO_INVENTORY = ROOT / "molecule" / "multinode" / "inventory"
CALLBACKS = HERE / "plugins" / "callback"
LAB = {
    "pdlab_name": "pdlab-faults",
    "pdlab_subnet": "10.254.81.128/25",
    "pdlab_gateway": "10.254.81.129",
    "pdlab_dir": str(ROOT / ".rehearsal" / "containers" / "faults"),
}
# The multinode scenario's addresses 10.254.81.N become 10.254.81.(128 + N) here.
ADDRESS = re.compile(r"\b10\.254\.81\.(\d+)\b")


def _docker_unavailable() -> str | None:
    """Why this machine cannot run container labs, or None."""
    if os.geteuid() != 0:
        return "needs root: the lab builds its image with debootstrap and runs containers"
    if shutil.which("docker") is None:
        return "docker is missing (.ci/run installs docker.io)"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"dockerd does not answer: {probe.stderr.strip()[:200]}"
    return None


_SKIP = _docker_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


def lab_inventory(target: Path) -> Path:
    """The multinode scenario's inventory, moved to the faults lab's addresses and SSH directory."""
    shutil.copytree(SCENARIO_INVENTORY / "group_vars", target / "group_vars")  # links become files
    # The stand-ins' addresses too (the Hub stand-in listens on the lab network's gateway).
    standins = target / "group_vars" / "all" / "zz-standins.yml"
    standins.write_text(ADDRESS.sub(lambda m: f"10.254.81.{128 + int(m.group(1))}", standins.read_text()))
    text = (SCENARIO_INVENTORY / "hosts.yml").read_text()
    text = ADDRESS.sub(lambda m: f"10.254.81.{128 + int(m.group(1))}", text)
    text = text.replace("{{ inventory_dir }}/../../../.rehearsal/containers/multinode", LAB["pdlab_dir"])
    (target / "hosts.yml").write_text(text)
    return target


def hosts(inventory: Path) -> list[str]:
    return list(yaml.safe_load((inventory / "hosts.yml").read_text())["pd_appliance"]["hosts"])


def container(host: str) -> str:
    return f"{LAB['pdlab_name']}-{host}"


def lab_playbook(
    name: str, inventory: Path, *args: str, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    return run_playbook(HERE / name, inventory, "-e", json.dumps(LAB), *args, **kwargs)  # type: ignore[arg-type]


def left_over() -> str:
    """IDs of every container and network still carrying the faults lab's label."""
    label = f"--filter=label=pdlab.lab={LAB['pdlab_name']}"
    out = subprocess.run(
        ["sh", "-c", f"docker ps --all --quiet {label}; docker network ls --quiet {label}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def on_host(host: str, script: str) -> str:
    """Run a shell script in the host's container (docker exec, not Ansible) and return its output."""
    out = subprocess.run(
        ["docker", "exec", container(host), "sh", "-c", script], capture_output=True, text=True, check=False
    )
    return out.stdout


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Path]:
    """Fresh lab hosts for one test; destroyed afterwards (also when create fails), nothing left."""
    inventory = lab_inventory(tmp_path / "inventory")
    lab_playbook("destroy.yml", inventory)  # a lab left by a killed run
    try:
        created = lab_playbook("create.yml", inventory)
        assert created.returncode == 0, created.stdout[-4000:] + created.stderr[-2000:]
        # The declared stand-ins, as molecule's prepare step starts them: the NVML and PCI-bus
        # stand-ins live on the hosts (/opt/pd-standins), and preflight reads them.
        prepared = run_playbook(ROOT / "standins" / "prepare.yml", inventory)
        assert prepared.returncode == 0, prepared.stdout[-4000:] + prepared.stderr[-2000:]
        yield inventory
    finally:
        run_playbook(ROOT / "standins" / "cleanup.yml", inventory)
        destroyed = lab_playbook("destroy.yml", inventory)
        assert destroyed.returncode == 0, destroyed.stdout[-4000:]
        assert left_over() == ""


def plays_with(output: str, marker: str) -> list[str]:
    """The names of the plays (stages) whose sections of ansible-playbook's output hold `marker`."""
    current, found = "", []
    for line in output.splitlines():
        header = re.match(r"^PLAY \[(.*)\] \*+", line)
        if header:
            current = header.group(1)
        elif marker in line and current not in found:
            found.append(current)
    return found


def play_of(output: str, marker: str) -> str | None:
    """The name of the first play whose section of ansible-playbook's output holds `marker`."""
    return next(iter(plays_with(output, marker)), None)


# What preflight must not change on a host: the appliance's directories, its account, its unit,
# the OS packages provision installs, and the set of running units.
FOOTPRINT = (
    "ls -d /opt/pd-appliance /etc/pd-appliance /srv/models /var/log/pd-appliance 2>&1; "
    "getent passwd pd-appliance; ls /etc/systemd/system/pd-appliance-supervisor.service 2>&1; "
    "dpkg-query --show --showformat='${Package} ${db:Status-Status}\\n' python3-venv numactl 2>&1; "
    "systemctl list-units --state=running --no-legend --plain | cut -d' ' -f1"
)


def test_bad_inventory_stops_in_preflight_before_any_change(lab: Path) -> None:
    """A decode GPU the host does not have: site.yml stops in Preflight and no host is changed."""
    inventory = yaml.safe_load((lab / "hosts.yml").read_text())
    decode_hosts = inventory["pd_appliance"]["children"]["decode"]["hosts"]
    decode_hosts["gpu-decode-01"] = {"serving_decode_gpus": [0, 1, 2, 9]}
    (lab / "hosts.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    before = {host: on_host(host, FOOTPRINT) for host in hosts(lab)}
    assert "pd-appliance:" not in before["gpu-decode-01"], "the lab must start fresh"

    result = run_playbook(ROOT / "site.yml", lab)
    output = result.stdout + result.stderr

    assert result.returncode != 0, output[-4000:]
    assert "gpu-decode-01: serving_decode_gpus=[0, 1, 2, 9] names GPU [9]" in output, output[-4000:]
    assert (play_of(output, "Preflight found") or "").startswith("Preflight"), output[-4000:]
    # Only the facts every stage gathers first, and Preflight, ran.
    started = re.findall(r"^PLAY \[(.*?)\]", output, flags=re.MULTILINE)
    assert any(name.startswith("Preflight") for name in started), started
    assert all(name.startswith(("Facts", "Preflight")) for name in started), started
    assert not re.search(r"^gpu-\S+\s+:.*changed=[1-9]", output, flags=re.MULTILINE), output[-2000:]
    after = {host: on_host(host, FOOTPRINT) for host in hosts(lab)}
    assert after == before


def test_decode_host_lost_mid_run_is_reported_unreachable_in_that_stage(lab: Path) -> None:
    """The decode host's container is killed when Provision starts: the run names host and stage.

    The fault strikes at the start of the first Provision play (preflight has passed on both
    hosts). PD_LAB_FAULT_PLAY=Serve moves it to a later stage, at the cost of a full provision.
    """
    decode = container("gpu-decode-01")
    sockets = f"$HOME/.ansible/cp/{LAB['pdlab_name']}-*"
    cut = f"docker kill {decode}; for s in {sockets}; do ssh -O exit -o ControlPath=$s lab; done"
    env = ansible_env()
    env.update(
        ANSIBLE_CALLBACK_PLUGINS=f"{CALLBACKS}:{ROOT / 'plugins/callback'}",
        ANSIBLE_CALLBACKS_ENABLED="pd_lab_fault,pd_plugin_preload",
        PD_LAB_FAULT_PLAY=os.environ.get("PD_LAB_FAULT_PLAY", "Provision"),
        PD_LAB_FAULT_COMMAND=json.dumps(["sh", "-c", cut]),
        # An operator's "stop everything when a host fails": the run ends in the stage that lost it.
        ANSIBLE_ANY_ERRORS_FATAL="True",
    )
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), str(ROOT / "site.yml"), "-i", str(lab)]
    result = run_owned(cmd, 900, env)
    output = result.stdout + result.stderr

    assert result.returncode != 0, output[-4000:]
    assert "PD_LAB_FAULT at the start of play" in output, output[-4000:]
    stage = play_of(output, "fatal: [gpu-decode-01]: UNREACHABLE!")
    assert stage is not None, output[-4000:]
    assert stage.startswith(env["PD_LAB_FAULT_PLAY"]), f"gpu-decode-01 reported unreachable in {stage!r}"
    recap = re.search(r"^gpu-decode-01\s+:.*unreachable=(\d+)", output, flags=re.MULTILINE)
    assert recap and int(recap.group(1)) >= 1, output[-2000:]
    # Before the fault the decode host took part: it passed preflight like the other.
    assert any(p.startswith("Preflight") for p in plays_with(output, "ok: [gpu-decode-01]")), output[:4000]


def test_destroy_on_nothing_is_a_no_op(tmp_path: Path) -> None:
    """destroy.yml on a lab that does not exist: succeeds, changes nothing, twice."""
    inventory = lab_inventory(tmp_path / "inventory")
    assert left_over() == "", "a pdlab-faults lab exists already; destroy it first"
    for _ in range(2):
        result = lab_playbook("destroy.yml", inventory)
        assert result.returncode == 0, result.stdout[-3000:]
        assert re.search(r"^localhost\s+:.*changed=0 ", result.stdout, flags=re.MULTILINE), result.stdout[
            -2000:
        ]
    assert left_over() == ""
    assert not Path(LAB["pdlab_dir"]).exists()
