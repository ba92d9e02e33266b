"""`pd-checkpoint verify` as a human runs it: the installed console script, in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    stat = shard.stat()
    with shard.open("r+b") as handle:
        handle.seek(stat.st_size - 10)
        handle.write(b"X")
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
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
