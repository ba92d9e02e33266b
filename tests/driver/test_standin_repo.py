"""The stand-in repository: real package names, every package named a stand-in, a valid signature."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pd_standins.apt_repo import build_repo

pytestmark = pytest.mark.slow  # runs dpkg-deb and gpg (a few seconds)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_repo(tmp_path_factory.mktemp("standin"), kernel="6.8.0-45-generic", distro="ubuntu2404")


def _field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), name], check=True, capture_output=True, text=True
    ).stdout


def test_every_package_says_it_is_a_stand_in(repo: dict[str, str]) -> None:
    debs = sorted(Path(repo["repo_dir"]).glob("*.deb"))
    assert len(debs) == int(repo["packages"]) > 20
    for deb in debs:
        assert _field(deb, "Description").startswith("STAND-IN for NVIDIA's "), deb.name


def test_the_real_names_and_the_traps_are_there(repo: dict[str, str]) -> None:
    index = (Path(repo["repo_dir"]) / "Packages").read_text()
    names = {line.split(": ", 1)[1] for line in index.splitlines() if line.startswith("Package: ")}
    assert {
        "cuda-keyring",
        "nvidia-open",
        "nvidia-driver-pinning-580",
        "cuda-drivers",
        "cuda-toolkit-13-0",
        "cuda-toolkit-13-1",
        "cuda-toolkit",
        "cuda-13-0",
        "linux-headers-6.8.0-45-generic",
    } <= names
    assert "Version: 580.172.08-1" in index and "Version: 590.44.01-1" in index


def test_release_is_signed_by_the_key_in_the_stand_in_keyring(repo: dict[str, str], tmp_path: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", repo["keyring_deb"], str(tmp_path)], check=True)
    keyring = tmp_path / "usr/share/keyrings/cuda-archive-keyring.gpg"
    source = (tmp_path / "etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list").read_text()
    assert "developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /" in source
    release = Path(repo["repo_dir"])
    subprocess.run(
        ["gpgv", "--keyring", str(keyring), str(release / "InRelease")], check=True, capture_output=True
    )
    tampered = tmp_path / "InRelease"
    tampered.write_text((release / "InRelease").read_text().replace("Packages", "Packagez", 1))
    bad = subprocess.run(["gpgv", "--keyring", str(keyring), str(tampered)], capture_output=True)
    assert bad.returncode != 0
