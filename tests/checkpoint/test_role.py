"""The checkpoint role itself, run by ansible-playbook against the rehearsal inventory.

The Hub stand-in (pd_standins.hub) serves the generated rehearsal checkpoint at the endpoint the
test passes as checkpoint_hf_endpoint, as standins/prepare.yml does for a rehearsal; the real
pd_hf_checkpoint module downloads and verifies it. The second run must change nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pd_standins.hub import RehearsalHub, generate
from pd_testlib import REHEARSAL_FILTER_PLUGINS, recap

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def standin_hub(tmp_path: Path) -> Iterator[RehearsalHub]:
    generate(tmp_path / "hub-repo")
    with RehearsalHub(tmp_path / "hub-repo", "nvidia/DeepSeek-V4-Flash-NVFP4") as server:
        yield server


def playbook(inventory: Path, hub: RehearsalHub, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_FILTER_PLUGINS"] = REHEARSAL_FILTER_PLUGINS
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
        "-e",
        f"checkpoint_hf_endpoint={hub.url}",
    ]
    return subprocess.run(
        [*command, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def recap_changed(output: str) -> int:
    counts = recap(output)
    assert counts["unreachable"] == counts["failed"] == 0, output[-3000:]
    return counts["changed"]


def test_role_downloads_verifies_and_is_idempotent(rehearsal_inventory_copy: Path, standin_hub: RehearsalHub):
    first = playbook(rehearsal_inventory_copy, standin_hub)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert recap_changed(first.stdout) >= 1
    # One directory per revision, named by its commit; the branch asked for is recorded in refs/.
    root = rehearsal_inventory_copy.parent.parent / ".rehearsal/root/srv/models/DeepSeek-V4-Flash-NVFP4"
    model_dir = root / standin_hub.repo.commit
    assert (root / "refs" / "main").read_text().strip() == standin_hub.repo.commit
    # The host state every later play reads (ansible_local.pd_appliance): the branch and its commit.
    fact = rehearsal_inventory_copy.parent.parent / ".rehearsal/root/etc/ansible/facts.d/pd_appliance.fact"
    assert json.loads(fact.read_text())["checkpoint"] == {
        "repo_id": "nvidia/DeepSeek-V4-Flash-NVFP4", "revision": "main", "commit": standin_hub.repo.commit,
        "refs": {"main": standin_hub.repo.commit},
    }  # fmt: skip
    manifest = json.loads((model_dir / ".pd-appliance-manifest.json").read_text())
    assert set(manifest["files"]) >= {"config.json", "model.safetensors.index.json"}
    assert any("/resolve/" in path for _, path in standin_hub.requests)

    second = playbook(rehearsal_inventory_copy, standin_hub)
    assert second.returncode == 0, second.stdout[-4000:]
    assert recap_changed(second.stdout) == 0
    assert "fetched 0, hashed 0" in second.stdout
    # The second run read the host state back (the facts play's gathering) and had nothing to record.
    flat = " ".join(second.stdout.split())
    assert "Record the checkpoint revision and the commit it names in the host state] *** skipping" in flat
    assert f"DeepSeek-V4-Flash-NVFP4@{standin_hub.repo.commit} in {model_dir}" in flat

    # Offline with a truncated shard: the play fails naming the file, and nothing is fetched.
    shard = model_dir / "model-00002-of-00003.safetensors"
    os.truncate(shard, 1000)
    requests_before = len(standin_hub.requests)
    offline = playbook(rehearsal_inventory_copy, standin_hub, "-e", "checkpoint_offline=true")
    assert offline.returncode != 0
    assert (
        "checkpoint_offline is true, so nothing is fetched" in offline.stdout and shard.name in offline.stdout
    )
    assert standin_hub.requests[requests_before:] == []
    assert shard.stat().st_size == 1000
