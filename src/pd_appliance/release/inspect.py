"""What a host has installed for a release, read from disk: nothing is imported or executed.

- the SGLang venv: the versions in its metadata (pd_appliance.sglang_versions) and the patch series
  the pd_sglang_patch_series module recorded in it;
- a checkpoint revision directory: its manifest (written only once every file was verified), the
  commit, and a digest of what the manifest says the files are.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pd_appliance.checkpoint.manifest import MANIFEST_NAME, ManifestError, load_manifest
from pd_appliance.release.errors import ReleaseError
from pd_appliance.sglang_versions import collect

PATCH_MARKER = "pd-appliance-patches.json"


def sglang_part(venv: Path, version: str, series: list[dict[str, str]]) -> dict[str, Any]:
    """The SGLang part of a release: version, build (the venv's name), series, NIXL, as installed in `venv`.

    Fails, naming the stage to run, when the venv is missing, holds another SGLang, or carries another
    series than `series` (the one the controller derives the venv's name from).
    """
    if not (venv / "bin").is_dir():
        raise ReleaseError(
            f"the SGLang venv {venv} (sglang {version}) is not installed: run the provision stage"
            " (--tags sglang) before serving this release"
        )
    try:
        found = collect(venv)
    except FileNotFoundError as exc:
        raise ReleaseError(f"{exc}: rebuild it with the provision stage (--tags sglang)") from exc
    versions = found["versions"]
    if versions.get("sglang") != version:
        raise ReleaseError(
            f"the SGLang venv {venv} holds sglang {versions.get('sglang')}, not {version}: it is incomplete;"
            " run the provision stage (--tags sglang) again"
        )
    marker = _read_json(venv / PATCH_MARKER)
    applied = [{"name": p.get("name"), "sha256": p.get("sha256")} for p in (marker or {}).get("patches", [])]
    if marker is None or applied != series:
        raise ReleaseError(
            f"the SGLang venv {venv} carries the patch series {[p['name'] for p in applied] or 'none'}"
            f" ({'no ' + PATCH_MARKER if marker is None else 'other patch digests'}), not the series"
            f" {[p['name'] for p in series]} it is named for: run the provision stage (--tags sglang)"
        )
    return {
        "version": version,
        "build": venv.name,
        "venv": str(venv),
        "series": applied,
        "nixl": versions.get("nixl"),
        "versions": {k: v for k, v in versions.items() if v is not None},
    }


def checkpoint_part(model_dir: Path, repo_id: str) -> dict[str, Any]:
    """The checkpoint part of a release: repository, commit and manifest digest of a verified revision."""
    try:
        manifest = load_manifest(model_dir)
    except ManifestError as exc:
        raise ReleaseError(f"{exc}: run the checkpoint stage to verify {model_dir} again") from exc
    if manifest is None:
        raise ReleaseError(
            f"{model_dir} holds no verified checkpoint ({MANIFEST_NAME} is written only once every file"
            " passed): run the checkpoint stage (--tags checkpoint) for this checkpoint_revision"
        )
    if manifest.repo_id != repo_id:
        raise ReleaseError(f"{model_dir} holds {manifest.repo_id}, but checkpoint_repo_id is {repo_id}")
    if model_dir.name != manifest.revision:
        raise ReleaseError(
            f"{model_dir} holds {manifest.repo_id}@{manifest.revision}: a revision directory must be named"
            " by its commit; run the checkpoint stage"
        )
    return {
        "repo_id": manifest.repo_id,
        "revision": manifest.revision,
        "requested": manifest.revision_requested,
        "dir": str(model_dir),
        "files": len(manifest.files),
        "bytes": manifest.total_bytes,
        "manifest_digest": manifest_digest(manifest.files),
    }


def manifest_digest(files: dict[str, Any]) -> str:
    """sha256 over (path, size, sha256) of every file: what the revision is, not when it was hashed."""
    listing = [(path, entry.size, entry.sha256) for path, entry in sorted(files.items())]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
