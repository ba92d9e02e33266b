"""What is installed in the SGLang venv, read from its metadata without importing anything heavy.

The `pd_sglang_versions` fact and the validation report name the versions a run used: SGLang,
torch and the CUDA it was built for, FlashInfer, the SGLang kernel wheel and NIXL. They are read
from the venv's dist-info (and torch/version.py for CUDA) by the tools venv's Python, so the check
neither imports torch nor needs a GPU, and works the same in rehearsal, where the heavy packages
are absent: those are reported as None and listed as missing, never guessed.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from pd_appliance.supply.venv_state import state_digest

__all__ = ["COMPONENTS", "collect", "installed", "state_digest", "torch_cuda", "venv_site_packages"]

# Fact key -> distribution names that provide it, first found wins (renames across releases).
COMPONENTS: dict[str, tuple[str, ...]] = {
    "sglang": ("sglang",),
    "torch": ("torch",),
    "flashinfer": ("flashinfer-python",),
    "sgl-kernel": ("sglang-kernel", "sgl-kernel"),
    "nixl": ("nixl-cu13", "nixl-cu12", "nixl"),
    "triton": ("triton",),
    # The appliance's kernels (kernels/, patch 0002's pd_splitkv); pd-appliance itself is not installed here.
    "pd-kernels": ("pd-kernels",),
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
    out: dict[str, str] = {}
    for dist in metadata.distributions(path=[str(site_packages)]):
        name = dist.name
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
