"""The build id that names an SGLang venv: the SGLang version's patch series and locks, digested.

It is computed on the controller from the files the sglang role installs from
(`sglang_patch_series_dir`, `sglang_lock_dir`), so every stage derives the same
`appliance_sglang_venv` without asking the host: provision builds the venv at that path, serve
points the programs at it. A changed patch (not a changed comment in `series`) or a regenerated
lock gives a new id, hence a new venv beside the old one; the old one keeps serving until the
programs are restarted on the new one.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from pd_appliance.patches.diff import PatchError
from pd_appliance.patches.series import load_series, sha256_hex
from pd_appliance.release.errors import ReleaseError

BUILD_ID_LENGTH = 12
# Lock directory files that decide what the venv holds (README and notes do not).
LOCK_SUFFIXES = (".txt", ".json", ".in")


def series_identity(series_dir: Path) -> list[dict[str, str]]:
    """[{name, sha256}] in series order: what the sglang_patch_series marker records."""
    try:
        raw, _warnings = load_series(series_dir)
    except PatchError as exc:
        raise ReleaseError(f"sglang_patch_series_dir {series_dir}: {exc}") from exc
    return [{"name": name, "sha256": sha256_hex(data)} for name, data in raw]


def lock_identity(lock_dir: Path) -> list[dict[str, str]]:
    """[{name, sha256}] of the lock directory's files, by name."""
    if not lock_dir.is_dir():
        raise ReleaseError(
            f"sglang_lock_dir {lock_dir} does not exist: generate the locks for this sglang_version"
            " (files/locks/README.md) or point sglang_lock_dir at them"
        )
    files = sorted(p for p in lock_dir.iterdir() if p.is_file() and p.name.endswith(LOCK_SUFFIXES))
    if not files:
        raise ReleaseError(f"sglang_lock_dir {lock_dir} holds no lock (*.txt, manifest.json)")
    return [{"name": p.name, "sha256": sha256_hex(p.read_bytes())} for p in files]


def build_id(series_dir: Path, lock_dir: Path) -> str:
    """The 12-hex id of the series and the locks together (cached per file state: it is templated often)."""
    return _build_id(str(series_dir), str(lock_dir), _stamp(series_dir), _stamp(lock_dir))


def _stamp(directory: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        return tuple(
            sorted(
                (p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in directory.iterdir() if p.is_file()
            )
        )
    except OSError:
        return ()


@lru_cache(maxsize=64)
def _build_id(series_dir: str, lock_dir: str, _s: object, _l: object) -> str:
    identity = {"series": series_identity(Path(series_dir)), "locks": lock_identity(Path(lock_dir))}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:BUILD_ID_LENGTH]
