"""`pd-checkpoint verify` as a human runs it: the installed console script, in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checkpoint_testlib import overwrite_in_place

from pd_appliance.checkpoint import ensure_checkpoint

pytestmark = pytest.mark.slow


def pd_checkpoint(*args: str) -> subprocess.CompletedProcess[str]:
    script = shutil.which("pd-checkpoint", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "pd_appliance.checkpoint.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, check=False)


def test_verify_reports_progress_and_catches_a_flipped_byte(hub, make_request):
    request = make_request(hub.url)
    ensure_checkpoint(request)
    ok = pd_checkpoint("verify", str(request.directory))
    assert ok.returncode == 0, ok.stderr
    assert "verified: nvidia/DeepSeek-V4-Flash-NVFP4@" in ok.stdout and "5 hashed" in ok.stdout
    assert "B/s" in ok.stderr and "verify 5 file(s)" in ok.stderr  # the tqdm bar: bytes, rate
    shard = request.directory / "model-00001-of-00003.safetensors"
    overwrite_in_place(shard, shard.stat().st_size - 10, b"X")
    quick = pd_checkpoint("verify", "--quick", "--json", str(request.directory))
    assert quick.returncode == 0 and json.loads(quick.stdout)["verified_by_stat"] == 5
    bad = pd_checkpoint("verify", "--json", str(request.directory))
    assert bad.returncode == 1
    result = json.loads(bad.stdout)
    assert (
        result["problems"][0]["path"] == shard.name and result["problems"][0]["problem"] == "sha256 mismatch"
    )


def test_verify_without_manifest_explains(tmp_path):
    result = pd_checkpoint("verify", str(tmp_path))
    assert result.returncode == 1 and "has no .pd-appliance-manifest.json" in result.stderr


def test_download_subcommand_takes_the_token_from_the_environment(repo_dir, repo_id, tmp_path):
    from pd_standins.hub import RehearsalHub

    target = tmp_path / "cli-model"
    with RehearsalHub(repo_dir, repo_id, required_token="hf_cliToken") as hub:
        args = (
            "download",
            "--repo-id",
            repo_id,
            "--revision",
            "main",
            "--dir",
            str(target),
            "--endpoint",
            hub.url,
        )
        denied = pd_checkpoint(*args)
        assert denied.returncode == 1 and "checkpoint_hf_token" in denied.stderr
        env = dict(os.environ, HF_TOKEN="hf_cliToken")
        script = shutil.which("pd-checkpoint", path=str(Path(sys.executable).parent))
        ok = subprocess.run([script, *args], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "downloaded and verified" in ok.stdout and (target / ".pd-appliance-manifest.json").exists()
