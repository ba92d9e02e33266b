"""Canonical's signed NVIDIA modules (nvidia_driver_source: ubuntu-signed), read from apt's own answers.

What Ubuntu's archive carries, as published on packages.ubuntu.com (checked 2026-12-03):

- the userspace comes from ``nvidia-graphics-drivers-<branch>-server``; its versions are
  ``<upstream>-0ubuntu0.<release>.<n>`` (``580.173.02-0ubuntu0.24.04.1`` in noble-security,
  ``580.95.05-0ubuntu0.24.04.3``); the R580 releases Ubuntu ships are not NVIDIA's CUDA-repository
  ones one for one (Ubuntu has 580.159.03, NVIDIA's repository 580.159.04);
- ``nvidia-headless-<branch>-server-open`` depends on ``nvidia-dkms-<branch>-server-open`` (a DKMS
  build, unsigned) and on ``nvidia-headless-no-dkms-<branch>-server-open``: with signed modules the
  no-dkms package is the one to install;
- the modules come from ``linux-restricted-modules``: ``linux-modules-nvidia-<branch>-server-open-<kernel>``
  for one kernel ABI (``...-6.8.0-90-generic``) and flavour meta packages (``...-generic``,
  ``...-generic-hwe-24.04``). Their version is the *kernel's* (``6.8.0-149.149``, ``6.8.0-147.147+1``),
  never the driver's; the driver they were built for is in their Depends:
  ``nvidia-kernel-common-<branch>[-server] (>= 580.173.02)``. So the module package is pinned with the
  userspace by choosing the version whose Depends names the userspace's driver release.

Everything here parses ``apt-cache madison`` and ``apt-cache show`` output, so the same code judges a
lab host and the stand-in archive of the tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_KERNEL_COMMON = r"nvidia-kernel-common-{branch}(?:-server)?\s*\(\s*(?:>=|=)\s*(?P<version>[^\s)]+)\s*\)"


def upstream(version: str) -> str:
    """NVIDIA's release in a Debian version: ``580.95.05-0ubuntu0.24.04.2`` -> ``580.95.05``."""
    return version.split(":", 1)[-1].split("-", 1)[0]


def _key(version: str) -> tuple[Any, ...]:
    """Natural order of version strings (numbers compared as numbers): enough to order the driver
    releases of one branch and the kernel ABI versions of one series (``6.8.0-90.91+1`` after
    ``6.8.0-90.91``)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", version) if p)


def parse_madison(text: str, package: str) -> list[str]:
    """Versions of ``package`` in ``apt-cache madison`` output (``pkg | version | source``), unique."""
    versions: list[str] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[0] == package and parts[1] not in versions:
            versions.append(parts[1])
    return versions


def parse_show(text: str) -> list[dict[str, str]]:
    """Stanzas of ``apt-cache show`` (every version apt knows), continuation lines joined."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last = {}, ""
        elif line[0].isspace() and last:
            current[last] += " " + line.strip()
        elif ":" in line:
            last, value = line.split(":", 1)
            current[last] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def module_driver(depends: str, branch: str) -> str | None:
    """The driver release a module package was built for, from its nvidia-kernel-common Depends."""
    match = re.search(_KERNEL_COMMON.format(branch=re.escape(branch)), depends)
    return upstream(match["version"]) if match else None


@dataclass
class Plan:
    """What the role installs and pins, or why it cannot."""

    reachable: bool
    carried: list[str] = field(default_factory=list)  # driver releases the archive has, oldest first
    driver: str = ""  # the release to install
    userspace_version: str = ""  # full Debian version of the userspace package
    module_version: str = ""  # full Debian version of the module package built for that release
    module_drivers: list[str] = field(default_factory=list)  # releases the module package exists for
    problems: list[str] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """For Ansible."""
        return dict(self.__dict__)


def plan(
    madison: str,
    module_show: str,
    *,
    userspace_package: str,
    module_package: str,
    branch: str,
    version: str,
    host: str = "",
) -> Plan:
    """Check ``version`` (``""``: the newest carried) against the archive and pick the module build.

    No record of the userspace package at all means apt has no index of the archive here (the host
    cannot reach it, or the restricted component is not configured): that is reported, not failed on.
    """
    where = f"{host}: " if host else ""
    versions = parse_madison(madison, userspace_package)
    if not versions:
        return Plan(
            reachable=False,
            note=(
                f"{where}apt knows no version of {userspace_package} (`apt-cache madison` is empty): "
                "Ubuntu's archive is unreachable from this host (run apt-get update once it is), its "
                "restricted component is not on, or nvidia_driver_branch has no -server-open driver; "
                f"nvidia_driver_version {version or '(newest)'} was not checked against it"
            ),
        )
    carried = sorted({upstream(v) for v in versions}, key=_key)
    result = Plan(reachable=True, carried=carried)
    driver = version or carried[-1]
    result.driver = driver
    matching = sorted((v for v in versions if upstream(v) == driver), key=_key)
    if not matching:
        result.problems.append(
            f"{where}nvidia_driver_version {driver} is not in Ubuntu's archive ({userspace_package} carries "
            f'{", ".join(carried)}); set nvidia_driver_version to one of those, or "" for the newest '
            "(NVIDIA's CUDA repository numbers its releases differently: use nvidia_driver_source: nvidia "
            "for those)"
        )
        return result
    result.userspace_version = matching[-1]
    builds = [s for s in parse_show(module_show) if s.get("Package") == module_package and s.get("Version")]
    by_driver: dict[str, list[str]] = {}
    for stanza in builds:
        built_for = module_driver(stanza.get("Depends", ""), branch)
        if built_for:
            by_driver.setdefault(built_for, []).append(stanza["Version"])
    result.module_drivers = sorted(by_driver, key=_key)
    if not builds:
        result.problems.append(
            f"{where}Ubuntu's archive has no {module_package}: Canonical builds signed modules only for "
            "its own kernels (linux-generic, linux-generic-hwe-<release>); boot one of those, or set "
            "nvidia_driver_ubuntu_kernel_flavour to a flavour it builds for"
        )
    elif driver not in by_driver:
        result.problems.append(
            f"{where}{module_package} exists in Ubuntu's archive for driver(s) "
            f"{', '.join(result.module_drivers) or 'none named in its Depends'} but not for {driver}: "
            "set nvidia_driver_version to one of those, or move to a kernel built against it"
        )
    else:
        result.module_version = sorted(by_driver[driver], key=_key)[-1]
    return result
