"""The NIXL post-install check: its decisions on their own, then the real NIXL wheel on this CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pd_appliance import nixl_check
from pd_appliance.nixl_check import BackendProbe, CheckReport, TransferResult

ROOT = Path(__file__).resolve().parents[2]
NIXL_WHEELS = ("nixl_cu13-1.5.1-cp311-cp311-manylinux_2_28_x86_64.whl", "nixl-1.5.1-py3-none-any.whl")
NIXL_HINT = "python -m pip download --no-deps -d artifacts/wheels nixl-cu13==1.5.1 nixl==1.5.1"


def _report(transfer: TransferResult | None) -> CheckReport:
    return CheckReport(
        nixl_module="nixl_cu13",
        nixl_version="1.5.1",
        plugins=["POSIX", "UCX"],
        backends=[BackendProbe("UCX", True, mem_types=["VRAM_SEG"]), BackendProbe("POSIX", False, "err")],
        required=["UCX"],
        missing_required=[],
        transfer=transfer,
        transfer_error=None,
        ok=True,
        problems=[],
    )


def _transfer(mem: str, gb_s: float) -> TransferResult:
    return TransferResult("UCX", mem, 0, 1, 2**28, 10, 2**28 * 10 / gb_s / 1e9, gb_s, True)


def test_bandwidth_is_decimal_gigabytes_per_second() -> None:
    assert nixl_check.bandwidth_gb_s(10**9, 4, 2.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="positive"):
        nixl_check.bandwidth_gb_s(1, 1, 0.0)


def test_missing_backends_keeps_required_order() -> None:
    probes = [BackendProbe("POSIX", True), BackendProbe("UCX", False, "NIXL_ERR_BACKEND")]
    assert nixl_check.missing_backends(probes, ["UCX", "POSIX", "GDS"]) == ["UCX", "GDS"]


def test_bandwidth_floor_fails_slow_gpu_transfers_only() -> None:
    slow = _report(_transfer("VRAM", 0.34))
    nixl_check.apply_bandwidth_floor(slow, 5.0)
    assert not slow.ok and "0.34 GB/s" in slow.problems[0] and "cuda_ipc" in slow.problems[0]
    host = _report(_transfer("DRAM", 0.34))
    nixl_check.apply_bandwidth_floor(host, 5.0)
    assert host.ok, "host-memory (no GPU) transfers are reported, not gated"
    fast = _report(_transfer("VRAM", 40.0))
    nixl_check.apply_bandwidth_floor(fast, 5.0)
    assert fast.ok


def test_format_report_names_the_path_and_the_verdict() -> None:
    text = nixl_check.format_report(_report(_transfer("VRAM", 12.5)))
    assert "backends created: UCX" in text and "GPU 0 -> GPU 1" in text and "12.5 GB/s" in text
    assert text.endswith("OK")


def test_without_nixl_the_report_fails_and_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nixl", None)  # makes `import nixl._api` raise ImportError
    report = nixl_check.run_check(["UCX"], "UCX", 1024, 1)
    assert not report.ok and report.missing_required == ["UCX"]
    assert "install nixl-cu13 and nixl" in report.problems[0]


def _nixl_wheels() -> list[Path] | None:
    dirs = [os.environ.get("PD_WHEEL_DIR"), ROOT / "artifacts" / "wheels"]
    found = {}
    for d in dirs:
        for name in NIXL_WHEELS:
            if d and (Path(d) / name).is_file():
                found.setdefault(name, Path(d) / name)
    return [found[n] for n in NIXL_WHEELS] if len(found) == len(NIXL_WHEELS) else None


@pytest.fixture(scope="module")
def nixl_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = _nixl_wheels()
    if wheels is None:
        pytest.skip(f"the nixl-cu13 1.5.1 and nixl 1.5.1 wheels are absent; fetch them with: {NIXL_HINT}")
    target = tmp_path_factory.mktemp("nixl-site")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target)]
    subprocess.run([*cmd, *map(str, wheels)], check=True, capture_output=True, timeout=300)
    return target


def _run_cli(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "src")]))
    cmd = [sys.executable, "-m", "pd_appliance.nixl_check", "--json", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_real_nixl_creates_ucx_and_moves_verified_bytes(nixl_site: Path) -> None:
    proc = _run_cli(nixl_site, "--size-mib", "8", "--iterations", "3", "--host-memory")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)  # plugins that print to fd 1 must not break the JSON
    assert report["nixl_module"] == "nixl_cu13" and report["nixl_version"] == "1.5.1"
    created = {b["name"] for b in report["backends"] if b["created"]}
    assert "UCX" in created
    assert any(not b["created"] and b["error"] for b in report["backends"]), "failures carry their error"
    t = report["transfer"]
    assert t["mem_type"] == "DRAM" and t["verified"] and t["bandwidth_gb_s"] > 0
    assert t["size_bytes"] == 8 * 2**20 and t["iterations"] == 3


@pytest.mark.slow
def test_real_nixl_fails_when_a_required_backend_cannot_be_created(nixl_site: Path) -> None:
    proc = _run_cli(nixl_site, "--require", "UCX", "--require", "GPUNETIO", "--transfer-backend", "")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["missing_required"] == ["GPUNETIO"] and report["transfer"] is None
    assert "FAILED: required NIXL backend GPUNETIO could not be created" in proc.stderr
