"""What is installed in the SGLang venv, read from its metadata without importing anything heavy.

The `pd_sglang_versions` fact and the validation report name the versions a run used: SGLang,
torch and the CUDA it was built for, FlashInfer, the SGLang kernel wheel and NIXL. They are read
from the venv's dist-info (and torch/version.py for CUDA) by the tools venv's Python, so the check
neither imports torch nor needs a GPU, and works the same in rehearsal, where the heavy packages
are absent: those are reported as None and listed as missing, never guessed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

# Fact key -> distribution names that provide it, first found wins (renames across releases).
COMPONENTS: dict[str, tuple[str, ...]] = {
    "sglang": ("sglang",),
    "torch": ("torch",),
    "flashinfer": ("flashinfer-python",),
    "sgl-kernel": ("sglang-kernel", "sgl-kernel"),
    "nixl": ("nixl-cu13", "nixl-cu12", "nixl"),
    "triton": ("triton",),
    "pd-appliance": ("pd-appliance",),
}
CUDA_RE = re.compile(r"^cuda\s*(?::[^=]+)?=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def venv_site_packages(venv: Path) -> Path:
    """The one lib/python3.X/site-packages of `venv`; an error naming the venv when there is none."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"expected one lib/python3.*/site-packages under {venv}, found {len(found)}: "
            "is appliance_sglang_venv the SGLang venv?"
        )
    return found[0]


def installed(site_packages: Path) -> dict[str, str]:
    """{canonical distribution name: version} of everything in `site_packages`."""
    out = {}
    for dist in metadata.distributions(path=[str(site_packages)]):
        name = dist.metadata.get("Name")
        if name:
            out[canonicalize_name(name)] = dist.version
    return out


def torch_cuda(site_packages: Path) -> str | None:
    """The CUDA version torch was built for, from torch/version.py (None for CPU builds or no torch)."""
    path = site_packages / "torch" / "version.py"
    if not path.is_file():
        return None
    m = CUDA_RE.search(path.read_text())
    return m.group(1) if m else None


def collect(venv: Path) -> dict[str, Any]:
    """{'versions': {component: version or None}, 'missing': [components not installed], ...}."""
    site = venv_site_packages(venv)
    dists = installed(site)
    versions: dict[str, str | None] = {}
    for key, names in COMPONENTS.items():
        versions[key] = next(
            (dists[canonicalize_name(n)] for n in names if canonicalize_name(n) in dists), None
        )
    versions["cuda"] = torch_cuda(site)
    missing = sorted(k for k, v in versions.items() if v is None)
    return {"versions": versions, "missing": missing, "site_packages": str(site)}


def state_digest(venv: Path, patch_marker: Path | None = None, state_files: Sequence[Path] = ()) -> str:
    """sha256 of what the sglang role's install, patch and verify steps leave in `venv`.

    The venv's pyvenv.cfg; every dist-info's name and RECORD (a RECORD lists each installed file
    with its hash, so an install, upgrade or removal changes it); the patch marker and the sha256
    each file it lists has now (a patched file edited or restored by hand changes it); and the role's
    own stamps (`state_files`). A re-run whose inputs and this digest match what the last passed
    run recorded has nothing to do (pd_appliance.proofs). Like `pip install` of a satisfied
    requirement, it does not re-hash every installed file: a file changed behind RECORD's back is
    what --force-checks is for.
    """
    site = venv_site_packages(venv)
    digest = hashlib.sha256()

    def add(label: str, data: bytes | None) -> None:
        digest.update(f"{label}\0{'-' if data is None else len(data)}\0".encode())
        digest.update(data or b"")

    add("pyvenv.cfg", _read(venv / "pyvenv.cfg"))
    for dist_info in sorted(site.glob("*.dist-info")):
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
