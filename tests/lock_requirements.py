"""Checks of a committed lock against the pinned wheels' Requires-Dist (tests/sglang/test_lock.py,
tests/tools/test_tools_lock.py): what the lock must honour, evaluated for the lock's target Python."""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from pd_appliance.supply.lock import LockEntry


@dataclass
class PinProblem:
    """A Requires-Dist of a pinned wheel that the lock does not honour."""

    requirement: str
    locked: str | None  # the locked version, None when the package is absent

    def __str__(self) -> str:
        have = "absent from the lock" if self.locked is None else f"locked at {self.locked}"
        return f"{self.requirement}: {have}"


def wheel_requirements(wheel: Path) -> list[str]:
    """Requires-Dist lines of a wheel's METADATA, read from the file itself."""
    with zipfile.ZipFile(wheel) as zf:
        [meta] = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        text = zf.read(meta).decode()
    headers = text.split("\n\n", 1)[0]
    prefix = "Requires-Dist:"
    return [ln.removeprefix(prefix).strip() for ln in headers.splitlines() if ln.startswith(prefix)]


def marker_environment(python_version: str, machine: str = "x86_64") -> dict[str, str]:
    """PEP 508 marker values of a CPython on Linux, for evaluating a lock's target platform."""
    full = python_version if python_version.count(".") == 2 else f"{python_version}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": full,
        "python_version": ".".join(full.split(".")[:2]),
        "sys_platform": "linux",
    }


def unmet_requirements(
    entries: Mapping[str, LockEntry],
    requires_dist: Iterable[str],
    environment: Mapping[str, str],
    extras: Iterable[str] = (),
    excluded: Iterable[str] = (),
) -> list[PinProblem]:
    """Every requirement that applies on ``environment`` (with ``extras`` asked for) and that the
    lock misses or pins outside its specifier. ``excluded`` names what the lock leaves out on
    purpose (the nixl shim's CUDA 12 wheel); those must not appear at all."""
    skipped = {canonicalize_name(n) for n in excluded}
    problems: list[PinProblem] = []
    asked = ["", *extras]
    for line in requires_dist:
        req = Requirement(line)
        if req.marker is not None and not any(
            req.marker.evaluate({**environment, "extra": extra}) for extra in asked
        ):
            continue
        name = canonicalize_name(req.name)
        if name in skipped:
            continue
        entry = entries.get(name)
        if entry is None or not req.specifier.contains(Version(entry.version), prereleases=True):
            problems.append(PinProblem(line, None if entry is None else entry.version))
    return problems


def marker_applies(marker: str, environment: Mapping[str, str]) -> bool:
    """Whether an entry's environment marker holds on the target (no marker: always)."""
    return not marker or Marker(marker).evaluate(dict(environment))
