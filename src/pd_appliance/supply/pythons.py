"""Which Python builds the SGLang venv on a host.

The locks under files/locks/sglang-<version>/ exist only for the Python versions that every locked
package has a wheel for (the generator asks uv to resolve with wheels only, so the wheels' tags decide:
sglang 0.5.23 ships cp311, cp312 and cp313 wheels and no cp310 one). A host whose own Python has a lock
uses it; any other host gets a uv-managed CPython of ``sglang_uv_python_version`` (Ubuntu 22.04's 3.10
has no sglang wheel). ``sglang_python_source`` forces one or the other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

SOURCES = ("auto", "host", "uv")

# What the role and preflight run on the host with the candidate interpreter (stdlib only, any
# Python 3): version, machine, C library, and whether `python -m venv` can bootstrap pip.
PROBE_SCRIPT = (
    "import importlib.util as u, json, platform, sys; "
    "print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3], 'machine': platform.machine(), "
    "'libc': list(platform.libc_ver()), 'executable': sys.executable, "
    "'venv': all(u.find_spec(m) is not None for m in ('venv', 'ensurepip'))}))"
)


class PythonChoiceError(ValueError):
    """No Python fits; the message names the host, the variable and the fix."""


@dataclass(frozen=True)
class Choice:
    """The interpreter that builds the venv and the lock it installs."""

    kind: str  # "host" or "uv"
    version: str  # major.minor
    lock: str  # file name inside the lock directory
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "version": self.version, "lock": self.lock, "reason": self.reason}


def parse_probe(stdout: str | None) -> dict[str, Any] | None:
    """The probe's JSON, or None when the interpreter did not run (not installed, not Python 3)."""
    if not stdout:
        return None
    try:
        probe = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return probe if isinstance(probe, dict) and "version" in probe else None


def _minor(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


def _platform_errors(
    host: str, probe: Mapping[str, Any], manifest: Mapping[str, Any], lock_dir: str
) -> list[str]:
    errors = []
    machine = manifest.get("machine", "x86_64")
    if probe.get("machine") and probe["machine"] != machine:
        errors.append(
            f"{host}: the SGLang locks in {lock_dir} are for {machine}, this host is {probe['machine']}: "
            f"regenerate them for it (python -m pd_appliance.supply.generate --machine {probe['machine']}, "
            "see files/locks/README.md)."
        )
    libc = list(probe.get("libc") or ["", ""])
    need = manifest.get("glibc")
    if need and libc[0] == "glibc":
        try:
            old = Version(libc[1]) < Version(need)
        except InvalidVersion:
            old = False
        if old:
            errors.append(
                f"{host}: glibc {libc[1]} is older than {need}, which the locked manylinux_"
                f"{need.replace('.', '_')} wheels need: use Ubuntu 22.04+ or Debian 12+."
            )
    return errors


def choose(
    host: str,
    probe: Mapping[str, Any] | None,
    manifest: Mapping[str, Any],
    source: str,
    uv_version: str,
    python_variable: str = "sglang_python",
) -> Choice:
    """The interpreter for this host, or PythonChoiceError naming what to change."""
    locks: dict[str, str] = dict(manifest.get("locks", {}))
    supported = ", ".join(sorted(locks, key=Version)) or "none"
    lock_dir = str(manifest.get("dir", "the lock directory"))
    if source not in SOURCES:
        raise PythonChoiceError(f"{host}: sglang_python_source={source!r}; use one of {', '.join(SOURCES)}.")
    host_version = _minor(probe["version"]) if probe else None
    if probe:
        errors = _platform_errors(host, probe, manifest, lock_dir)
        if errors:
            raise PythonChoiceError(" ".join(errors))
    if source in ("auto", "host") and host_version in locks:
        return Choice("host", host_version, locks[host_version], f"host Python {probe['version']} has a lock")  # type: ignore[index]
    if source == "host":
        if probe is None:
            raise PythonChoiceError(
                f"{host}: {python_variable} does not run a Python 3 interpreter: install it (with its venv "
                f"package) or point {python_variable} at one of Python {supported}, or set "
                "sglang_python_source: uv for a uv-managed Python."
            )
        why = manifest.get("unsupported", {}).get(host_version, "no lock was generated for it")
        raise PythonChoiceError(
            f"{host}: {python_variable} is Python {probe['version']}, but the pinned SGLang wheels exist "
            f"only for Python {supported} ({host_version}: {why}). Set sglang_python_source: uv (uv-managed "
            f"Python {uv_version}) or point {python_variable} at a Python {supported}."
        )
    if _minor(uv_version) not in locks:
        raise PythonChoiceError(
            f"{host}: sglang_uv_python_version={uv_version!r} has no lock in {lock_dir}; "
            f"use one of {supported}."
        )
    if probe is None:
        reason = f"{python_variable} does not run here"
    elif source == "uv":
        reason = "sglang_python_source is uv"
    else:
        reason = f"host Python {probe['version']} has no lock (wheels exist for {supported})"
    return Choice("uv", _minor(uv_version), locks[_minor(uv_version)], reason)


def python_errors(
    host: str,
    probe: Mapping[str, Any] | None,
    manifest: Mapping[str, Any],
    source: str,
    uv_version: str,
    python_variable: str = "sglang_python",
) -> list[str]:
    """Preflight: the choice's error as a list (empty when some Python fits)."""
    try:
        choose(host, probe, manifest, source, uv_version, python_variable)
    except PythonChoiceError as exc:
        return [str(exc)]
    return []
