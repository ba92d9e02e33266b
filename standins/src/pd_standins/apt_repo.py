"""Build a signed local apt repository of STAND-IN packages that carry NVIDIA's real package names.

NVIDIA's CUDA repository is unreachable here, so the molecule scenario (molecule/driver) converges
the nvidia_driver and cuda_toolkit roles against this one instead. Every package is empty apart from
a README (and, where the roles read it, a file shaped like the real one: the keyring, the branch pin,
an nvcc that only prints its version); every description starts with "STAND-IN". The repository is
flat, like NVIDIA's (`deb <url> /`), and signed with a throwaway key shipped in the stand-in
cuda-keyring, so the role's Signed-By handling is exercised for real.

    python standins/src/pd_standins/apt_repo.py DEST --kernel "$(uname -r)" [--distro debian12]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Three driver releases: the pinned one, a newer one in the same branch (the pin must win over it)
# and one of the next branch (the branch pin must keep it out).
DRIVER_VERSIONS = ("580.159.04-1", "580.172.08-1", "590.44.01-1")
NVCC_ARCHES = "75 80 86 87 88 89 90 100 103 110 120 121"
ORIGIN = "pd-appliance stand-in for NVIDIA's CUDA repository"


@dataclass
class StandIn:
    """One stand-in .deb: real name and version, fake contents."""

    name: str
    version: str
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    files: dict[str, str | bytes] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    conffiles: list[str] = field(default_factory=list)
    arch: str = "amd64"
    vendor: str = "NVIDIA's"  # whose package it stands in for, in the description


def _nvcc(release: str, build: str) -> str:
    arches = "\\n".join(f"compute_{a}" for a in NVCC_ARCHES.split())
    return f"""#!/bin/sh
# STAND-IN for NVIDIA's nvcc {release} (standins/src/pd_standins/apt_repo.py): prints, compiles nothing.
case "$1" in
  --version) printf 'nvcc: NVIDIA (R) Cuda compiler driver\\n'
             printf 'Cuda compilation tools, release {release}, V{build}\\n' ;;
  --list-gpu-arch) printf '{arches}\\n' ;;
  *) echo "stand-in nvcc: $*: not a compiler" >&2; exit 1 ;;
esac
"""


def driver_packages(version: str) -> list[StandIn]:
    """The open and proprietary driver trees of one release."""
    same = f"(= {version})"
    tree = ["libnvidia-ml1", "nvidia-persistenced", "nvidia-smi"]
    packages = [StandIn(name, version) for name in tree]
    packages += [
        StandIn("nvidia-kernel-open-dkms", version, conflicts=["nvidia-kernel-dkms"]),
        StandIn("nvidia-kernel-dkms", version, conflicts=["nvidia-kernel-open-dkms"]),
        StandIn(
            "nvidia-open",
            version,
            depends=[f"nvidia-kernel-open-dkms {same}"] + [f"{p} {same}" for p in tree],
        ),
        StandIn(
            "cuda-drivers", version, depends=[f"nvidia-kernel-dkms {same}"] + [f"{p} {same}" for p in tree]
        ),
    ]
    branch = version.split(".")[0]
    if version == next(v for v in DRIVER_VERSIONS if v.startswith(branch + ".")):  # first of the branch
        pin = f"/etc/apt/preferences.d/nvidia-driver-pinning-{branch}"
        packages.append(
            StandIn(
                f"nvidia-driver-pinning-{branch}",
                version,
                arch="all",
                files={
                    pin: "Package: nvidia-* libnvidia-* cuda-drivers*\n"
                    f"Pin: version {branch}.*\nPin-Priority: 1000\n"
                },
                conffiles=[pin],
            )
        )
    return packages


# Ubuntu's archive as packages.ubuntu.com lists it (2026-12-03): two releases of the 580-server userspace
# (versions <upstream>-0ubuntu0.24.04.<n>) and, for one kernel, two builds of Canonical's signed module
# package whose versions are the kernel's (6.8.0-45.45, then the rebuild 6.8.0-45.45+1 against the newer
# driver); the driver each was built against is only in its Depends, as in linux-restricted-modules.
UBUNTU_DRIVERS = (("580.126.20-0ubuntu0.24.04.2", ""), ("580.173.02-0ubuntu0.24.04.1", "+1"))


def ubuntu_signed_packages(kernel: str) -> list[StandIn]:
    """Ubuntu-shaped userspace and signed-module stand-ins for nvidia_driver_source: ubuntu-signed."""
    base, _, rest = kernel.partition("-")
    abi = rest.split("-")[0] if rest.split("-")[0].isdigit() else "1"
    packages: list[StandIn] = []
    for version, rebuild in UBUNTU_DRIVERS:
        upstream, same = version.split("-")[0], f"(= {version})"
        common = StandIn("nvidia-kernel-common-580-server", version, vendor="Canonical's")
        packages += [
            common,
            StandIn("nvidia-utils-580-server", version, vendor="Canonical's"),
            StandIn(
                "nvidia-headless-no-dkms-580-server-open",
                version,
                depends=[f"nvidia-kernel-common-580-server {same}"],
                vendor="Canonical's",
            ),
            StandIn(
                f"linux-modules-nvidia-580-server-open-{kernel}",
                f"{base}-{abi}.{abi}{rebuild}",  # the kernel's version, e.g. 6.8.0-45.45+1
                depends=[f"nvidia-kernel-common-580-server (>= {upstream})"],
                vendor="Canonical's",
            ),
        ]
    return packages


def toolkit_packages(kernel: str) -> list[StandIn]:
    """Two toolkits and the two meta packages that would pull a second toolkit or a driver."""
    packages = [StandIn(f"linux-headers-{kernel}", "1.0-1")]
    for minor, full, nvcc in (("13-0", "13.0.2-1", "13.0.88"), ("13-1", "13.1.0-1", "13.1.80")):
        dotted = minor.replace("-", ".")
        nvcc_path = f"/usr/local/cuda-{dotted}/bin/nvcc"
        packages += [
            StandIn(
                f"cuda-nvcc-{minor}", full, files={nvcc_path: _nvcc(dotted, nvcc)}, modes={nvcc_path: 0o755}
            ),
            StandIn(f"cuda-toolkit-{minor}", full, depends=[f"cuda-nvcc-{minor} (= {full})"]),
        ]
    packages += [
        StandIn("cuda-toolkit", "13.1.0-1", depends=["cuda-toolkit-13-1"]),
        StandIn("cuda-13-0", "13.0.2-1", depends=["cuda-toolkit-13-0", "cuda-drivers"]),
    ]
    return packages


def keyring_package(keyring: bytes, distro: str) -> StandIn:
    """cuda-keyring 1.1-1 as NVIDIA ships it: the key plus a source list pointing at NVIDIA."""
    source = f"/etc/apt/sources.list.d/cuda-{distro}-x86_64.list"
    return StandIn(
        "cuda-keyring",
        "1.1-1",
        arch="all",
        files={
            "/usr/share/keyrings/cuda-archive-keyring.gpg": keyring,
            source: "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
            f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/ /\n",
        },
        conffiles=[source],
    )


def build_deb(pkg: StandIn, out_dir: Path, work: Path) -> Path:
    """dpkg-deb one stand-in."""
    root = work / f"{pkg.name}_{pkg.version}"
    (root / "DEBIAN").mkdir(parents=True)
    readme = root / "usr" / "share" / "doc" / pkg.name / "README.stand-in"
    readme.parent.mkdir(parents=True)
    readme.write_text(f"STAND-IN for {pkg.name} {pkg.version}: built by pd_standins.apt_repo.\n")
    for path, content in pkg.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
        target.chmod(pkg.modes.get(path, 0o644))
    control = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        f"Architecture: {pkg.arch}",
        "Maintainer: pd-appliance tests <standin@invalid>",
        "Section: misc",
        "Priority: optional",
    ]
    if pkg.depends:
        control.append("Depends: " + ", ".join(pkg.depends))
    if pkg.conflicts:
        control.append("Conflicts: " + ", ".join(pkg.conflicts))
    control.append(
        f"Description: STAND-IN for {pkg.vendor} {pkg.name} (no driver or toolkit inside)\n"
        " Test double for pd-appliance's molecule/driver scenario; never install it on a real host."
    )
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    if pkg.conffiles:
        (root / "DEBIAN" / "conffiles").write_text("\n".join(pkg.conffiles) + "\n")
    deb = out_dir / f"{pkg.name}_{pkg.version}_{pkg.arch}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def _gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", *args], check=True, capture_output=True
    ).stdout


def write_index(repo: Path, home: Path) -> None:
    """Packages, Packages.gz, Release, InRelease and Release.gpg for a flat repository."""
    packages = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True, capture_output=True
    ).stdout
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    lines = [
        f"Origin: {ORIGIN}",
        "Label: STAND-IN",
        "Date: " + time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime()),
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (repo / "Release").write_text("\n".join(lines) + "\n")
    _gpg(home, "--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
    _gpg(home, "--yes", "-abs", "-o", str(repo / "Release.gpg"), str(repo / "Release"))


def build_repo(dest: Path, kernel: str, distro: str = "debian12") -> dict[str, str]:
    """Build the repository under dest/<distro>/x86_64 and return its paths."""
    repo = dest / distro / "x86_64"
    repo.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="standin-gpg-") as tmp:
        home = Path(tmp) / "gnupg"
        home.mkdir(mode=0o700)
        try:
            _gpg(
                home,
                "--passphrase",
                "",
                "--quick-gen-key",
                "pd-appliance STAND-IN repo <standin@invalid>",
                "ed25519",
                "sign",
                "never",
            )
            keyring = _gpg(home, "--export")
            fingerprint = next(
                line.split(":")[9]
                for line in _gpg(home, "--with-colons", "--list-keys").decode().splitlines()
                if line.startswith("fpr:")
            )
            # The throwaway key's fingerprint: what the role's keyring check must be told to trust.
            (repo / "keyring.fingerprint").write_text(fingerprint + "\n")
            packages = [keyring_package(keyring, distro), *toolkit_packages(kernel)]
            for version in DRIVER_VERSIONS:
                packages += driver_packages(version)
            work = Path(tmp) / "build"
            debs = [build_deb(pkg, repo, work) for pkg in packages]
            write_index(repo, home)
        finally:
            subprocess.run(
                ["gpgconf", "--homedir", str(home), "--kill", "all"], check=False, capture_output=True
            )
    return {
        "repo_dir": str(repo),
        "repo_url": f"file://{repo}/",
        "keyring_deb": str(repo / "cuda-keyring_1.1-1_all.deb"),
        "keyring_fingerprint": fingerprint,
        "packages": str(len(debs)),
    }


def main() -> int:
    """CLI for molecule's create step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--kernel", required=True, help="running kernel (for the stand-in linux-headers)")
    parser.add_argument("--distro", default="debian12", help="repository distro path, e.g. ubuntu2404")
    args = parser.parse_args()
    print(json.dumps(build_repo(args.dest.resolve(), args.kernel, args.distro)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
