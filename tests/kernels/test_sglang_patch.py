"""The pd_splitkv integration patch applies to the pinned SGLang 0.5.23 wheel's files and byte-compiles."""

from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

PATCH = (
    Path(__file__).resolve().parents[2] / "files/patches/sglang/0.5.23/0002-pd-splitkv-decode-backend.patch"
)
WHEEL = Path(
    os.environ.get("PD_SGLANG_WHEEL", "/work/wheels/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl")
)


def _targets() -> list[str]:
    return [line[6:].strip() for line in PATCH.read_text().splitlines() if line.startswith("--- a/")]


def test_patch_has_a_header_and_touches_only_sglang_files() -> None:
    text = PATCH.read_text()
    header = text[: text.index("\n--- a/")]
    assert "pd_splitkv" in header and "Measurement" in header and "Why" in header
    assert not any(line.startswith(("--- ", "+++ ", "diff ", "@@")) for line in header.splitlines())
    assert _targets() == [
        "sglang/kernels/ops/attention/flash_mla_sm120.py",
        "sglang/srt/models/deepseek_v4.py",
    ]


@pytest.mark.skipif(not WHEEL.is_file(), reason=f"pinned wheel not at {WHEEL} (set PD_SGLANG_WHEEL)")
@pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch")
def test_patch_applies_to_the_pinned_wheel_and_compiles(tmp_path: Path) -> None:
    with zipfile.ZipFile(WHEEL) as wheel:
        for member in _targets():
            wheel.extract(member, tmp_path)
    dry = subprocess.run(
        ["patch", "-p1", "--dry-run", "-i", str(PATCH)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    done = subprocess.run(
        ["patch", "-p1", "-i", str(PATCH)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "FAILED" not in done.stdout, done.stdout + done.stderr
    for member in _targets():
        py_compile.compile(str(tmp_path / member), doraise=True)
    dispatch = (tmp_path / _targets()[0]).read_text()
    assert 'PD_SPLITKV_BACKEND = "pd_splitkv"' in dispatch
    assert "from pd_kernels.sparse_mla_decode import sparse_mla_decode" in dispatch
    model = (tmp_path / _targets()[1]).read_text()
    assert 'SGLANG_SM120_FLASHMLA_BACKEND.get() == "pd_splitkv"' in model
