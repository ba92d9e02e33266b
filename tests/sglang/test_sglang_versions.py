"""pd_sglang_versions from a venv's metadata: present ones versioned, absent ones None and named."""

from __future__ import annotations

from pathlib import Path

import pytest

from pd_appliance.sglang_versions import collect, torch_cuda, venv_site_packages


def _dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_collect_reports_versions_and_names_the_missing(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    _dist(site, "sglang", "0.5.23")
    _dist(site, "flashinfer_python", "0.7.2")
    _dist(site, "sglang-kernel", "0.4.10")
    _dist(site, "nixl-cu13", "1.5.1")
    _dist(site, "torch", "2.14.1")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda: Optional[str] = '13.0'\n")
    found = collect(tmp_path / "venv")
    v = found["versions"]
    assert v["sglang"] == "0.5.23" and v["flashinfer"] == "0.7.2" and v["sgl-kernel"] == "0.4.10"
    assert v["nixl"] == "1.5.1" and v["torch"] == "2.14.1" and v["cuda"] == "13.0"
    assert v["triton"] is None and found["missing"] == ["pd-appliance", "triton"]


def test_cpu_torch_has_no_cuda(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text("cuda: Optional[str] = None\n")
    assert torch_cuda(tmp_path) is None
    assert torch_cuda(tmp_path / "nowhere") is None


def test_not_a_venv_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is appliance_sglang_venv the SGLang venv"):
        venv_site_packages(tmp_path)


def test_real_installed_wheel(installed_sglang: Path, tmp_path: Path) -> None:
    venv = tmp_path / "v"
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "python3.11").symlink_to(installed_sglang.parent)
    found = collect(venv)
    assert found["versions"]["sglang"] == "0.5.23" and "torch" in found["missing"]
