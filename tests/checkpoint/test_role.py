"""The checkpoint role itself, run by ansible-playbook against the rehearsal inventory.

The rehearsal hub (a stand-in for the Hugging Face Hub) serves the generated checkpoint; the real
hf_checkpoint module downloads and verifies it. The second run must change nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def playbook(inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("USER", "root" if os.geteuid() == 0 else str(os.getlogin()))
    binary = str(Path(sys.executable).parent / "ansible-playbook")
    # The tools venv is the appliance_tools role's to build; this interpreter has the same packages.
    command = [
        binary,
        "playbooks/checkpoint.yml",
        "-i",
        str(inventory),
        "-e",
        f"appliance_tools_python={sys.executable}",
    ]
    return subprocess.run(
        [*command, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def recap_changed(output: str) -> int:
    match = re.search(r"localhost\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", output)
    assert match, output[-3000:]
    return int(match.group(1))


def test_role_downloads_verifies_and_is_idempotent(rehearsal_inventory_copy: Path, tmp_path: Path):
    first = playbook(rehearsal_inventory_copy)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert "REHEARSAL: the Hugging Face Hub is not reachable" in first.stdout
    assert recap_changed(first.stdout) >= 1
    model_dir = tmp_path / ".rehearsal/root/srv/models/DeepSeek-V4-Flash-NVFP4"
    manifest = json.loads((model_dir / ".pd-appliance-manifest.json").read_text())
    assert set(manifest["files"]) >= {"config.json", "model.safetensors.index.json"}
    hub_state = tmp_path / ".rehearsal/root/var/lib/pd-appliance/rehearsal-hub"
    assert not (hub_state / "hub.json").exists()  # the hub was stopped
    log = (tmp_path / ".rehearsal/root/var/log/pd-appliance/rehearsal-hub.log").read_text()
    assert "rehearsal hub (stand-in for the Hugging Face Hub)" in log and "/resolve/" in log

    second = playbook(rehearsal_inventory_copy)
    assert second.returncode == 0, second.stdout[-4000:]
    assert recap_changed(second.stdout) == 0
    assert "fetched 0, hashed 0" in second.stdout

    # Offline with a truncated shard: the play fails naming the file, and nothing is fetched.
    shard = model_dir / "model-00002-of-00003.safetensors"
    os.truncate(shard, 1000)
    requests_before = log_lines(tmp_path)
    offline = playbook(rehearsal_inventory_copy, "-e", "checkpoint_offline=true")
    assert offline.returncode != 0
    assert (
        "checkpoint_offline is true, so nothing is fetched" in offline.stdout and shard.name in offline.stdout
    )
    assert not [
        line for line in log_lines(tmp_path)[len(requests_before) :] if '"GET ' in line or '"HEAD ' in line
    ]
    assert shard.stat().st_size == 1000


def log_lines(tmp_path: Path) -> list[str]:
    return (tmp_path / ".rehearsal/root/var/log/pd-appliance/rehearsal-hub.log").read_text().splitlines()
