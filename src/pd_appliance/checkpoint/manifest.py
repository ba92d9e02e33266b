"""The checkpoint manifest: what was verified, so that an unchanged checkpoint re-verifies by stat.

`.pd-appliance-manifest.json` in the checkpoint directory records the repository, the resolved
commit and, per file, the size, sha256 and git blob id it was verified against, plus the
mtime and inode it had when its bytes were last hashed. A file whose size, mtime and inode
still match its entry is taken as verified without reading it; anything else is re-hashed.
The manifest is written to a temporary name, fsynced, and renamed, so a crash never leaves a
half-written manifest under its final name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pd_appliance.files import write_atomic

MANIFEST_NAME = ".pd-appliance-manifest.json"
MANIFEST_FORMAT = "pd-appliance-checkpoint-manifest"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ManifestEntry:
    """One verified file. `lfs` is true when `sha256` came from the Hub's LFS metadata."""

    size: int
    sha256: str
    git_blob_id: str | None
    lfs: bool
    mtime_ns: int
    inode: int


@dataclass
class Manifest:
    """The whole manifest; `files` is keyed by repository path."""

    repo_id: str
    revision: str
    revision_requested: str
    endpoint: str
    files: dict[str, ManifestEntry] = field(default_factory=dict)
    # Repository files that checkpoint_allow/ignore_patterns left out on purpose.
    unselected: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())

    def same_content(self, other: Manifest | None) -> bool:
        """Equal in everything but the endpoint it came from (a mirror or a new rehearsal port)."""
        return other is not None and (self.repo_id, self.revision, self.revision_requested, self.files) == (
            other.repo_id,
            other.revision,
            other.revision_requested,
            other.files,
        )

    def to_json(self) -> str:
        body = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "revision_requested": self.revision_requested,
            "endpoint": self.endpoint,
            "total_bytes": self.total_bytes,
            "files": {path: asdict(entry) for path, entry in sorted(self.files.items())},
            "unselected": list(self.unselected),
        }
        return json.dumps(body, indent=2, sort_keys=False) + "\n"


class ManifestError(ValueError):
    """The manifest exists but cannot be used; the message says why."""


def load_manifest(directory: Path) -> Manifest | None:
    """The manifest in `directory`, None when there is none; ManifestError when it is unreadable."""
    path = directory / MANIFEST_NAME
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ManifestError(f"{path}: unreadable ({err})") from err
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path}: not a pd-appliance checkpoint manifest")
    if raw.get("version") != MANIFEST_VERSION:
        raise ManifestError(
            f"{path}: manifest version {raw.get('version')!r}, this tool reads {MANIFEST_VERSION}"
        )
    try:
        files = {str(p): ManifestEntry(**entry) for p, entry in raw["files"].items()}
        return Manifest(
            repo_id=str(raw["repo_id"]),
            revision=str(raw["revision"]),
            revision_requested=str(raw["revision_requested"]),
            endpoint=str(raw.get("endpoint", "")),
            files=files,
            unselected=[str(p) for p in raw.get("unselected", [])],
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise ManifestError(f"{path}: malformed manifest ({err})") from err


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Write atomically (temporary file, fsync, rename, fsync of the directory); returns the path."""
    path = directory / MANIFEST_NAME
    write_atomic(path, manifest.to_json(), mode=0o644, make_parents=False)
    return path
