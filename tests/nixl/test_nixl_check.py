"""The NIXL post-install check: its decisions on their own, then the real NIXL wheel on this CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pd_appliance import nixl_check
from pd_appliance.fabric import kv_need
from pd_appliance.nixl_check import BackendProbe, CheckReport, TransferResult

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
H200 = ROOT / "tests" / "fabric" / "fixtures" / "h200-2026-12-03"
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
    assert not slow.ok and "at 0.34 GB/s, below the 5 GB/s required (the explicit floor" in slow.problems[0]
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


@pytest.mark.parametrize(
    ("log", "size", "kind", "lanes"),
    [
        ("ucx-proto-used-dram-cma.log", 8 * 2**20, "shm", ["cma/memory"]),
        ("ucx-proto-y-dram-cma.log", 8 * 2**20, "shm", ["cma/memory"]),  # UCX_PROTO_INFO=y: no counts
        ("ucx-proto-used-dram-tcp.log", 8 * 2**20, "tcp", ["52% on tcp/lo and 48% on tcp/eth0"]),
        # H200, both agents in one process: CUDA IPC cannot open its own handles, UCX emulates on TCP.
        ("ucx-proto-used-vram-one-process-tcp.log", 2**28, "tcp", ["tcp/lo"]),
    ],
)
def test_transport_is_read_from_recorded_ucx_tables(log: str, size: int, kind: str, lanes: list[str]) -> None:
    use = nixl_check.write_transport((FIXTURES / log).read_text(), size, "recorded")
    assert (use.kind, use.lanes) == (kind, lanes)


def test_table_rows_without_counts_are_chosen_by_size() -> None:
    row = nixl_check.ProtoRow("2049..9383", "copy-in", "rc_mlx5/mlx5_0:1/path0")
    assert nixl_check.row_covers(row, 4096) and not nixl_check.row_covers(row, 2**20)
    assert nixl_check.row_covers(nixl_check.ProtoRow("0..2K", "short", "x"), 2048)
    assert nixl_check.row_covers(nixl_check.ProtoRow("9384..inf", "zero-copy", "x"), 2**30)
    assert nixl_check.transport_kind(["cuda_copy", "tcp"]) == "tcp"
    assert nixl_check.transport_kind(["cuda_copy", "posix"]) == "cuda_copy"
    assert nixl_check.transport_kind(["rc_mlx5"]) == "rdma"
    assert nixl_check.transport_kind([]) == "unknown"


def _recorded(case: str) -> tuple[CheckReport, str]:
    data = json.loads((H200 / f"nixl-{case}.json").read_text())
    t = data["transfer"]
    report = _report(TransferResult(**t))
    return report, (H200 / f"nixl-{case}.ucx.log").read_text()


@pytest.mark.parametrize(
    ("case", "kind", "ok"),
    [
        ("default", "cuda_ipc", True),
        ("serving-tls", "cuda_ipc", True),
        ("no-cuda-ipc", "tcp", False),
        ("expandable-segments", "tcp", False),
    ],
)
def test_h200_record_tells_cuda_ipc_from_the_tcp_fallback(case: str, kind: str, ok: bool) -> None:
    """Recorded on the lent H200 (tests/fabric/device_run.sh): GPU 0 -> GPU 0 across two processes."""
    report, log = _recorded(case)
    nixl_check.apply_transport(report, log, "cuda_ipc", "UCX_PROTO_INFO=used")
    nixl_check.apply_bandwidth_floor(report, 5.0)
    assert report.transport is not None and report.transport.kind == kind
    assert report.ok is ok, report.problems
    if not ok:
        assert "went through tcp (tcp/lo; software emulation), not cuda_ipc" in report.problems[0]
        assert "over tcp (tcp/lo) (host-staged) at 0.4" in report.problems[1]
        assert "below the 5 GB/s required (the explicit floor" in report.problems[1]
    if case == "expandable-segments":
        assert report.transfer.src_ipc_capable is False  # type: ignore[union-attr]
        assert "not legacy-IPC capable" in report.problems[0]


def test_no_table_with_an_expectation_fails_and_names_the_option() -> None:
    report = _report(_transfer("VRAM", 40.0))
    nixl_check.apply_transport(report, "no ucx output", "cuda_ipc", "UCX_PROTO_INFO=used")
    assert not report.ok and "--proto-info y" in report.problems[0]
    quiet = _report(_transfer("VRAM", 40.0))
    nixl_check.apply_transport(quiet, "no ucx output", "", "UCX_PROTO_INFO=used")
    assert quiet.ok and quiet.transport.kind == "unknown"  # type: ignore[union-attr]


class _FakeLibcuda:
    def __init__(self, status: int, value: int) -> None:
        self.status, self.value = status, value

    def cuPointerGetAttribute(self, out: object, attribute: int, pointer: object) -> int:
        assert attribute == 10  # CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE (cuda.h, read on the H200)
        out._obj.value = self.value  # type: ignore[attr-defined]
        return self.status


def test_legacy_ipc_probe_reads_the_driver_answer() -> None:
    assert nixl_check.legacy_ipc_capable(1, _FakeLibcuda(0, 1)) is True
    assert nixl_check.legacy_ipc_capable(1, _FakeLibcuda(0, 0)) is False
    assert nixl_check.legacy_ipc_capable(1, _FakeLibcuda(1, 0)) is None  # CUDA_ERROR_INVALID_VALUE


def test_a_link_below_its_maximum_under_load_warns_or_fails() -> None:
    slow = nixl_check.LinkReading(4, "00000000:58:00.0", 4, 5, 8, 16, "nvml", 20.1)
    fine = nixl_check.LinkReading(0, "00000000:18:00.0", 5, 5, 16, 16, "nvml", 54.5)
    (sentence,) = nixl_check.link_problems([slow, fine])
    assert "GPU 4 (00000000:58:00.0)" in sentence and "Gen4 of Gen5 and x8 of x16" in sentence
    warned = _report(_transfer("VRAM", 40.0))
    nixl_check.apply_links(warned, [slow], "warn")
    assert warned.ok and len(warned.warnings) == 1
    failed = _report(_transfer("VRAM", 40.0))
    nixl_check.apply_links(failed, [slow], "fail")
    assert not failed.ok
    skipped = _report(_transfer("VRAM", 40.0))
    nixl_check.apply_links(skipped, [slow], "skip")
    assert skipped.ok and not skipped.warnings and skipped.links == [slow]


def test_h200_link_under_load_was_at_its_maximum() -> None:
    data = json.loads((H200 / "nixl-default.json").read_text())
    (link,) = [nixl_check.LinkReading(**r) for r in data["links"]]
    assert (link.generation_current, link.width_current) == (5, 16) and link.source == "nvml"
    assert nixl_check.link_problems([link]) == []


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
    assert "UCX transport: shm" in proc.stderr
    report = json.loads(proc.stdout)  # plugins that print to fd 1 must not break the JSON
    assert report["nixl_module"] == "nixl_cu13" and report["nixl_version"] == "1.5.1"
    created = {b["name"] for b in report["backends"] if b["created"]}
    assert "UCX" in created
    assert any(not b["created"] and b["error"] for b in report["backends"]), "failures carry their error"
    t = report["transfer"]
    assert t["mem_type"] == "DRAM" and t["verified"] and t["bandwidth_gb_s"] > 0
    assert t["size_bytes"] == 8 * 2**20 and t["iterations"] == 3
    # The target agent ran in its own process; UCX moved the bytes by shared memory between them.
    assert report["memory"].startswith("DRAM (host memory: GPU stand-in)")
    assert report["transport"]["kind"] == "shm" and report["transport"]["source"] == "UCX_PROTO_INFO=used"


@pytest.mark.slow
def test_real_nixl_without_gpu_memory_fails_instead_of_measuring_dram(nixl_site: Path) -> None:
    proc = _run_cli(nixl_site, "--size-mib", "1", "--iterations", "1", "--expect-transport", "cuda_ipc")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["transfer"] is None and report["memory"] == "VRAM"
    assert "does not fall back to host memory" in report["problems"][0]


@pytest.mark.slow
def test_real_nixl_fails_when_a_required_backend_cannot_be_created(nixl_site: Path) -> None:
    proc = _run_cli(nixl_site, "--require", "UCX", "--require", "GPUNETIO", "--transfer-backend", "")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["missing_required"] == ["GPUNETIO"] and report["transfer"] is None
    assert "FAILED: required NIXL backend GPUNETIO could not be created" in proc.stderr


# ---- The path judged by the KV figures (pd_appliance.fabric.kv_need) ----------------------------


def _need(targets: dict[int, int]) -> nixl_check.KvRequirement:
    """The requirement the play passes for the lab's model at `targets` (1024/128-token requests)."""
    fabric = _fabric_helpers()
    need = kv_need.need_for_deployment(fabric.CONFIG, None, targets, fabric.LAB_INPUT, fabric.LAB_OUTPUT)
    return nixl_check.KvRequirement(need.need_gb_s, need.margin, 0.0, need.basis())


def _fabric_helpers() -> Any:
    spec = importlib.util.spec_from_file_location(
        "fabric_snapshots", ROOT / "tests" / "fabric" / "fabric_snapshots.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _judged(case: str, need: nixl_check.KvRequirement) -> CheckReport:
    """A recorded run, its transport read from its UCX tables as the check does, judged by `need`."""
    report, log = _recorded(case)
    nixl_check.apply_transport(report, log, "", "UCX_PROTO_INFO=used")
    nixl_check.apply_kv_path(report, need)
    return report


def test_recorded_host_staged_path_below_the_lab_need_fails_naming_the_figures() -> None:
    """UCX_TLS without cuda_ipc on the lent H200: VRAM over tcp/lo at 0.483 GB/s (recorded). The lab's
    line needs 1000 x 1024/128 = 8000 prompt tok/s x 7043.6 bytes = 0.05635 GB/s per rank pair; x 10
    = 0.5635 GB/s, which 0.483 GB/s (8.6x the need) does not reach."""
    report = _judged("host-staged-tcp", _need({1: 210, 16: 1000}))
    assert not report.ok and report.warnings == []
    (problem,) = report.problems
    assert "GPU 0 -> GPU 0 moves KV over tcp (tcp/lo) (host-staged) at 0.483 GB/s" in problem
    assert "below the 0.563 GB/s required (the need is 0.05635 GB/s per TP rank pair x margin 10)" in problem
    assert "1000 output tok/s at C=16 x 1024/128 prompt/output tokens = 8000 prompt tok/s" in problem
    assert "keep each prefill -> decode pair on one socket" in problem
    assert report.kv is not None and report.kv["verdict"] == "fail" and report.kv["host_staged"] is True
    assert report.kv["required_gb_s"] == pytest.approx(0.56349, rel=1e-4)
    assert report.kv["measured_gb_s"] == pytest.approx(0.48304, rel=1e-4)


def test_recorded_host_staged_path_that_covers_the_need_warns_with_the_figures() -> None:
    """The same recorded path for a single-stream deployment (210 output tok/s: 1680 prompt tok/s x
    7043.6 bytes = 0.01183 GB/s per rank pair, x 10 = 0.1183 GB/s): 0.483 GB/s covers it, 41x."""
    report = _judged("host-staged-tcp", _need({1: 210}))
    assert report.ok and report.problems == []
    (warning,) = report.warnings
    assert "GPU 0 -> GPU 0 moves KV host-staged over tcp (tcp/lo) at 0.483 GB/s (41x the need)" in warning
    assert "covers the 0.118 GB/s required (the need is 0.01183 GB/s per TP rank pair x margin 10)" in warning
    assert "210 output tok/s at C=1" in warning
    assert report.kv is not None and report.kv["verdict"] == "warn"
    assert (
        "KV path: 0.483 GB/s over tcp (tcp/lo) against 0.118 GB/s required (warn)"
        in nixl_check.format_report(report)
    )


def test_recorded_staging_through_shared_memory_still_lands_on_tcp() -> None:
    """UCX_TLS=cuda_copy,sm,tcp,self: UCX still moved VRAM over tcp/lo (0.36 GB/s): fails the lab need."""
    report = _judged("host-staged-shm", _need({16: 1000}))
    assert report.transport is not None and report.transport.lanes == ["tcp/lo"]
    assert not report.ok and "at 0.36 GB/s, below the 0.563 GB/s required" in report.problems[0]


def test_recorded_cuda_ipc_path_passes_the_lab_need_quietly() -> None:
    report = _judged("default", _need({16: 1000}))
    assert report.ok and report.warnings == [] and report.kv is not None and report.kv["verdict"] == "ok"


def test_an_explicit_floor_wins_over_the_derived_need() -> None:
    """nixl_check_min_bandwidth_gb_s set: it replaces need x margin; the need is still named."""
    need = _need({16: 1000})
    floor = nixl_check.KvRequirement(need.need_gb_s, need.margin, 0.25, need.basis)
    report = _judged("host-staged-tcp", floor)
    assert (
        report.ok
        and "covers the 0.25 GB/s required (the explicit floor nixl_check_min_bandwidth_gb_s"
        in report.warnings[0]
    )
    assert "the need is 0.05635 GB/s per TP rank pair" in report.warnings[0]


def test_a_host_staged_path_with_nothing_to_judge_it_by_fails() -> None:
    report = _judged(
        "host-staged-tcp", nixl_check.KvRequirement(basis="the checkpoint is not on this host yet")
    )
    assert not report.ok and "nothing to judge that by" in report.problems[0]
    assert "the checkpoint is not on this host yet" in report.problems[0]
    direct = _judged("default", nixl_check.KvRequirement())
    assert direct.ok and direct.kv is not None and direct.kv["verdict"] == "unjudged"


def test_cli_takes_the_need_the_margin_and_the_floor() -> None:
    args = nixl_check.build_parser().parse_args(
        ["--kv-need-gb-s", "0.0563", "--kv-margin", "10", "--kv-basis", "b", "--min-gb-s", "0"]
    )
    assert (args.kv_need_gb_s, args.kv_margin, args.kv_basis, args.min_gb_s) == (0.0563, 10.0, "b", 0.0)
