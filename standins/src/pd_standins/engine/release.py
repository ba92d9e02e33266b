"""What the rehearsal engine stands in for: the SGLang venv and the checkpoint revision of its release.

In the lab a worker runs `<venv>/bin/python -m sglang.launch_server --model-path <revision dir>`, so
the venv (the SGLang build and patch series) and the checkpoint revision of the release are on its
command line. The rehearsal engine is given the same two paths (`--sim-sglang-python`, the interpreter
the real engine would run from, and SGLang's own `--model-path`) and reads, without importing
anything, what a real engine would load from them: the sglang version in the venv's metadata, the
patch series the appliance recorded in the venv, and the commit in the revision's manifest. It
reports them in /server_info ("stands_in_for") and in the X-PD-Simulator header of every response,
so a request through the router says which release answered. A path that holds nothing is reported
as such (a real engine would not start; the rehearsal engine says so and serves on).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("pd_sim_worker")

MANIFEST = ".pd-appliance-manifest.json"
PATCH_MARKER = "pd-appliance-patches.json"


def _sglang_version(venv: Path) -> str | None:
    for dist_info in sorted(venv.glob("lib/python3*/site-packages/sglang-*.dist-info")):
        metadata = dist_info / "METADATA"
        try:
            text = metadata.read_text(errors="replace")
        except OSError:
            continue
        match = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
        if match:
            return match.group(1)
    return None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(sglang_python: str | None, model_path: str | None) -> dict[str, Any]:
    """{python, venv, sglang_version, patch_series, model_path, model_revision}; None where absent."""
    out: dict[str, Any] = {
        "python": sglang_python,
        "venv": None,
        "sglang_version": None,
        "patch_series": None,
    }
    if sglang_python:
        venv = Path(sglang_python).parent.parent
        out["venv"] = str(venv)
        out["sglang_version"] = _sglang_version(venv)
        marker = _json(venv / PATCH_MARKER)
        out["patch_series"] = [p.get("name") for p in marker.get("patches", [])] if marker else None
        if out["sglang_version"] is None:
            log.warning("no sglang in %s: a real engine would not start from %s", venv, sglang_python)
    manifest = _json(Path(model_path) / MANIFEST) if model_path else {}
    out["model_path"] = model_path
    out["model_revision"] = manifest.get("revision")
    if model_path and not manifest:
        log.warning(
            "no verified checkpoint (%s) in %s: a real engine would not load it", MANIFEST, model_path
        )
    return out


def header_value(info: dict[str, Any]) -> str:
    """`sglang=<version>; venv=<venv name>; model=<commit, 12 hex>` for the X-PD-Simulator header."""
    venv = Path(info["venv"]).name if info.get("venv") else "-"
    revision = str(info.get("model_revision") or "-")[:12]
    return f"sglang={info.get('sglang_version') or '-'}; venv={venv}; model={revision}"
