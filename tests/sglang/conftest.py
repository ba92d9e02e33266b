"""Fixtures for the SGLang tests: the real pinned wheel, installed (without dependencies) once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rendered_layouts import lab, real, two_hosts, variant_hosts  # noqa: F401 (session fixtures)
from sglang_testlib import DOWNLOAD_HINT, SERIES_DIR, SGLANG_VERSION, find_sglang_wheel


@pytest.fixture(scope="session")
def sglang_wheel() -> Path:
    wheel = find_sglang_wheel()
    if wheel is None:
        pytest.skip(f"the sglang {SGLANG_VERSION} wheel is absent; fetch it with: {DOWNLOAD_HINT}")
    return wheel


@pytest.fixture(scope="session")
def installed_sglang(sglang_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site-packages with the real wheel installed by pip (--no-deps), shared read-only by the tests."""
    target = tmp_path_factory.mktemp("sglang-site") / "site-packages"
    cmd = [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
        "--disable-pip-version-check", "--only-binary=:all:", "--implementation", "cp",
        "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
        "--target", str(target), str(sglang_wheel),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return target


@pytest.fixture
def site_packages(installed_sglang: Path, tmp_path: Path) -> Path:
    """A private copy of the installed tree made of hard links: cheap, and safe because the
    applier replaces files (new inodes) instead of writing into them."""
    target = tmp_path / "site-packages"
    subprocess.run(["cp", "-al", str(installed_sglang), str(target)], check=True)
    return target


@pytest.fixture
def series_copy(tmp_path: Path) -> Path:
    """A private copy of the repo's series directory, to add, edit or break patches in."""
    target = tmp_path / "series"
    shutil.copytree(SERIES_DIR, target)
    return target
