"""pd_sglang_versions from a venv's metadata: present ones versioned, absent ones None and named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pd_appliance.sglang_versions import collect, state_digest, torch_cuda, venv_site_packages


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
    assert v["triton"] is None and found["missing"] == ["pd-kernels", "triton"]


def test_cpu_torch_has_no_cuda(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text("cuda: Optional[str] = None\n")
    assert torch_cuda(tmp_path) is None
    assert torch_cuda(tmp_path / "nowhere") is None


def test_the_state_digest_sees_installs_patches_and_stamps_not_bytecode(tmp_path: Path) -> None:
    """What makes the sglang role's steps run again (roles/sglang/tasks/state.yml) and what does not."""
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("version = 3.11.2\n")
    for name in ("sglang", "numpy"):
        _dist(site, name, "1.0")
        (site / f"{name}-1.0.dist-info" / "RECORD").write_text(f"{name}/__init__.py,sha256=abc,3\n")
    (site / "sglang").mkdir()
    patched = site / "sglang" / "engine.py"
    patched.write_text("patched\n")
    marker, stamp = venv / "pd-appliance-patches.json", venv / "pd-appliance-wheel.sha256"
    marker.write_text(json.dumps({"files": {"sglang/engine.py": {"patched_sha256": "x"}}}))
    stamp.write_text("aa\n")

    def digest() -> str:
        return state_digest(venv, marker, [stamp])

    base = digest()
    assert digest() == base, "deterministic"
    (site / "sglang" / "__pycache__").mkdir()
    (site / "sglang" / "__pycache__" / "engine.cpython-311.pyc").write_bytes(b"\0")
    assert digest() == base, "byte-compiling changes nothing the steps make"
    locked = state_digest(venv, packages=["sglang"])
    _dist(site, "uv", "0.9")
    (site / "uv-0.9.dist-info" / "RECORD").write_text("uv/__init__.py,,\n")
    assert state_digest(venv, packages=["sglang"]) == locked, "another role's package is not this state"
    assert digest() != base, "without a package list, every install counts"
    shutil.rmtree(site / "uv-0.9.dist-info")
    changes = {
        "a patched file edited": lambda: patched.write_text("edited\n"),
        "a patched file removed": patched.unlink,
        "a package upgraded": lambda: (site / "numpy-1.0.dist-info" / "RECORD").write_text(
            "numpy/x.py,sha256=d,1\n"
        ),
        "a package removed": lambda: shutil.rmtree(site / "numpy-1.0.dist-info"),
        "the kernels' stamp": lambda: stamp.write_text("bb\n"),
        "the patch marker": lambda: marker.write_text("{}"),
    }
    for what, change in changes.items():
        saved = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} | {
            p: p.read_bytes() for p in (marker, stamp)
        }
        change()
        assert digest() != base, what
        for path, data in saved.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        assert digest() == base, f"restored after: {what}"


def test_not_a_venv_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is appliance_sglang_venv the SGLang venv"):
        venv_site_packages(tmp_path)


def test_real_installed_wheel(installed_sglang: Path, tmp_path: Path) -> None:
    venv = tmp_path / "v"
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "python3.11").symlink_to(installed_sglang.parent)
    found = collect(venv)
    assert found["versions"]["sglang"] == "0.5.23" and "torch" in found["missing"]
