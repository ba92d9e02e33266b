"""The state an install leaves in a venv, as one digest: what makes a provisioning proof run again.

The sglang role (the SGLang venv) and appliance_tools (the tools and router venvs) skip their
installers when the venv's state and the inputs are what the last passed run recorded
(pd_appliance.proofs); this is the state half.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name


def site_packages(venv: Path) -> Path:
    """The one lib/python3.X/site-packages of `venv`; an error naming the venv when there is none."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one lib/python3.*/site-packages under {venv}, found {len(found)}")
    return found[0]


def state_digest(
    venv: Path,
    patch_marker: Path | None = None,
    state_files: Sequence[Path] = (),
    packages: Collection[str] | None = None,
) -> str:
    """sha256 of what installing (and, for the SGLang venv, patching) leaves in `venv`.

    The venv's pyvenv.cfg; every dist-info's name and RECORD (a RECORD lists each installed file
    with its hash, so an install, upgrade or removal changes it); the patch marker and the sha256
    each file it lists has now (a patched file edited or restored by hand changes it); and a role's
    own stamps (`state_files`). With `packages`, only those distributions' RECORDs count: what
    another role installs into the venv later (uv into the tools venv) is not this install's state,
    and `pip install --no-deps -r lock` leaves an extra package alone too. A re-run whose inputs
    and this digest match what the last passed run recorded has nothing to do
    (pd_appliance.proofs). Like `pip install` of a satisfied requirement, it does not re-hash every
    installed file: a file changed behind RECORD's back is what --force-checks is for.
    """
    site = site_packages(venv)
    digest = hashlib.sha256()

    def add(label: str, data: bytes | None) -> None:
        digest.update(f"{label}\0{'-' if data is None else len(data)}\0".encode())
        digest.update(data or b"")

    add("pyvenv.cfg", _read(venv / "pyvenv.cfg"))
    wanted = None if packages is None else {canonicalize_name(name) for name in packages}
    for dist_info in sorted(site.glob("*.dist-info")):
        if wanted is None or canonicalize_name(dist_info.name.split("-")[0]) in wanted:
            add(f"record:{dist_info.name}", _read(dist_info / "RECORD"))
    marker_text = _read(patch_marker) if patch_marker is not None else None
    add("patch-marker", marker_text)
    for rel in sorted(_marker_files(marker_text)):
        content = _read(site / rel)
        add(f"patched:{rel}", None if content is None else hashlib.sha256(content).hexdigest().encode())
    for path in state_files:
        add(f"state:{path}", _read(path))
    return digest.hexdigest()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _marker_files(marker_text: bytes | None) -> list[str]:
    """The files a patch marker lists (none when it is absent or unreadable: it then changes the digest)."""
    if not marker_text:
        return []
    try:
        files = json.loads(marker_text).get("files", {})
    except (ValueError, AttributeError):
        return []
    return [str(rel) for rel in files] if isinstance(files, dict) else []


def venvs_digest(venvs: Sequence[Path], packages: Collection[str] | None = None) -> str:
    """One digest over several venvs' states, in the order given (`packages`: as state_digest)."""
    states = [f"{venv}:{state_digest(venv, packages=packages)}" for venv in venvs]
    return hashlib.sha256(json.dumps(states).encode()).hexdigest()
