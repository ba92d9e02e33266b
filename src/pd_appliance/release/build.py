"""The build id that names an SGLang venv: the SGLang version's patch series, locks and kernels, digested.

It is computed on the controller from the files the sglang role installs from
(`sglang_patch_series_dir`, `sglang_lock_dir`, and `sglang_kernels_dir`: the source tree of the
pd-kernels distribution, the Triton kernels the patched SGLang calls, whose wheel the venv holds), so
every stage derives the same `appliance_sglang_venv` without asking the host: provision builds the
venv at that path, serve points the programs at it. A changed patch (not a changed comment in
`series`) or a regenerated lock or a changed kernel gives a new id, hence a new venv beside the old
one; the old one keeps serving until the programs are restarted on the new one, and a rollback to
its release runs the old kernel again.
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
# What a wheel build leaves at the top of the kernels' source tree (setuptools' build/, dist/).
BUILD_OUTPUTS = ("build", "dist")


def series_identity(series_dir: Path) -> list[dict[str, str]]:
    """[{name, sha256}] in series order: what the pd_sglang_patch_series marker records."""
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


def kernels_sources(kernels_dir: Path) -> list[Path]:
    """The files of the kernels' source tree that go into their wheel: its pyproject.toml and every
    file under it but what a build or an editable install leaves there (bytecode, egg-info, build/,
    dist/), which is not a change."""
    if not kernels_dir.is_dir():
        raise ReleaseError(
            f"sglang_kernels_dir {kernels_dir} does not exist: point it at the source tree of the"
            " pd-kernels distribution the SGLang venv ships (kernels/ in the checkout)"
        )
    return sorted(
        p
        for p in kernels_dir.rglob("*")
        if p.is_file() and p.suffix != ".pyc" and not _build_output(p.relative_to(kernels_dir))
    )


def _build_output(relative: Path) -> bool:
    parts = relative.parts
    return (
        "__pycache__" in parts
        or any(part.endswith(".egg-info") for part in parts)
        or parts[0] in BUILD_OUTPUTS
    )


def kernels_identity(kernels_dir: Path) -> list[dict[str, str]]:
    """[{name, sha256}] of the kernels' sources (kernels_sources), by path."""
    return [
        {"name": str(p.relative_to(kernels_dir)), "sha256": sha256_hex(p.read_bytes())}
        for p in kernels_sources(kernels_dir)
    ]


def build_id(series_dir: Path, lock_dir: Path, kernels_dir: Path | None = None) -> str:
    """The 12-hex id of the series, the locks and the kernels together (cached per file state: it is
    templated often). Without kernels_dir, the id of the series and locks alone."""
    kernels = (str(kernels_dir), _stamp(kernels_dir, "*")) if kernels_dir is not None else None
    return _build_id(str(series_dir), str(lock_dir), _stamp(series_dir), _stamp(lock_dir), kernels)


def _stamp(directory: Path, pattern: str = "") -> tuple[tuple[str, int, int], ...]:
    """Each file's name, mtime and size: the cache key (a pattern: matching files at any depth)."""
    try:
        files = directory.rglob(pattern) if pattern else directory.iterdir()
        return tuple(sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files if p.is_file()))
    except OSError:
        return ()


@lru_cache(maxsize=64)
def _build_id(
    series_dir: str, lock_dir: str, _s: object, _l: object, kernels: tuple[str, object] | None
) -> str:
    identity: dict[str, object] = {
        "series": series_identity(Path(series_dir)),
        "locks": lock_identity(Path(lock_dir)),
    }
    if kernels is not None:
        identity["kernels"] = kernels_identity(Path(kernels[0]))
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:BUILD_ID_LENGTH]
