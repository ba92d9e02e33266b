"""Apply a patch series to an installed wheel, idempotently, and remember what was applied.

The state lives in a JSON marker: the package and version, each patch's name and sha256 in series
order, and for every file the series touched the sha256 of the pristine and of the patched file.

- Same series, files as the marker says: nothing changes (`changed` false).
- Different series (a patch added, removed, reordered or edited), or files that drifted (a
  `pip install --force-reinstall` put pristine files back, someone edited one): every file the old
  or the new series touches goes back to its pristine bytes first, then the new series is applied
  on top. Pristine bytes come from the wheel file when one is given, else from the copy this
  module saved before it first patched the file; either is checked against the sha256 in the
  installed wheel's RECORD, so a "pristine" copy is provably the released file.
- Every patch is applied in memory and each patched .py file is compiled before anything is
  written: a hunk that does not apply fails naming patch and hunk, and the package is untouched.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pd_appliance.files import write_atomic
from pd_appliance.patches.diff import FilePatch, PatchError, apply_file_patch, parse_patch

MARKER_FORMAT = 1


@dataclass
class Patch:
    """One patch of the series: its file name, sha256 (hex) and parsed file diffs."""

    name: str
    sha256: str
    files: list[FilePatch]


@dataclass
class SeriesResult:
    """What apply_series did (or, in check mode, would do)."""

    changed: bool
    action: str  # "unchanged", "applied", "reapplied" or "repaired"
    patches: list[dict[str, str]]
    patched_files: list[str]
    restored_files: list[str] = field(default_factory=list)
    written_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    msg: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hash(data: bytes) -> str:
    """The `sha256=<urlsafe base64, no padding>` form a wheel's RECORD uses."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def load_series(series_dir: Path) -> tuple[list[tuple[str, bytes]], list[str]]:
    """Read `series` (one patch file name a line, `#` comments) and the patches it names, in order.

    Returns the patches and warnings (patch files present but not listed, which are not applied).
    """
    series_file = series_dir / "series"
    if not series_file.is_file():
        raise PatchError(f"no series file at {series_file}: list the patches to apply, one per line")
    names: list[str] = []
    for raw in series_file.read_text().splitlines():
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        if "/" in name or name in (".", ".."):
            raise PatchError(f"{series_file}: {name!r} must be a file name in {series_dir}")
        if name in names:
            raise PatchError(f"{series_file}: {name} is listed twice")
        names.append(name)
    patches = []
    for name in names:
        path = series_dir / name
        if not path.is_file():
            raise PatchError(f"{series_file} lists {name}, but {path} does not exist")
        patches.append((name, path.read_bytes()))
    unlisted = sorted(p.name for p in series_dir.glob("*.patch") if p.name not in names)
    warnings = [f"{name} is in {series_dir} but not in series: not applied" for name in unlisted]
    return patches, warnings


def parse_series(raw: list[tuple[str, bytes]]) -> list[Patch]:
    out = []
    for name, data in raw:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PatchError(f"{name}: not UTF-8 text ({exc})") from exc
        files = parse_patch(text, name)
        for fp in files:
            if fp.old_path is not None and fp.old_path != fp.new_path:
                raise PatchError(f"{name}: renames ({fp.old_path} -> {fp.new_path}) are not supported")
        out.append(Patch(name=name, sha256=sha256_hex(data), files=files))
    return out


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_dist_info(site_packages: Path, package: str, version: str) -> Path:
    """The `<package>-<version>.dist-info` directory, or an error naming what is installed instead."""
    want = _normalize(package)
    found = []
    for entry in sorted(site_packages.glob("*.dist-info")):
        dist, _, ver = entry.name[: -len(".dist-info")].partition("-")
        if _normalize(dist) == want:
            if ver == version:
                return entry
            found.append(entry.name)
    detail = f" (found {', '.join(found)})" if found else ""
    raise PatchError(
        f"{package} {version} is not installed in {site_packages}{detail}: install "
        f"{package}=={version} before applying its patch series"
    )


def read_record(dist_info: Path) -> dict[str, str]:
    """RECORD as {relative path: 'sha256=...'} (entries without a hash, like RECORD itself, skipped)."""
    record = dist_info / "RECORD"
    if not record.is_file():
        raise PatchError(f"{record} is missing: the installed package cannot be verified; reinstall it")
    rows = csv.reader(io.StringIO(record.read_text()))
    return {row[0]: row[1] for row in rows if len(row) >= 2 and row[1]}


def _load_marker(marker: Path) -> dict[str, Any] | None:
    if not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise PatchError(
            f"marker {marker} is unreadable ({exc}): delete it and reinstall the package "
            "(pip install --force-reinstall --no-deps), then re-run"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT:
        raise PatchError(f"marker {marker} has an unknown format: delete it and reinstall the package")
    return data


class _Pristine:
    """Source of pristine file bytes, each checked against RECORD before use."""

    def __init__(self, site_packages: Path, record: dict[str, str], backup_dir: Path, wheel: Path | None):
        self.site_packages = site_packages
        self.record = record
        self.backup_dir = backup_dir
        self.wheel = zipfile.ZipFile(wheel) if wheel else None
        self.wheel_path = wheel

    def get(self, rel: str) -> bytes | None:
        """Pristine bytes of `rel`; None when the wheel does not ship it (a patch creates it)."""
        if rel not in self.record:
            return None
        want = self.record[rel]
        candidates: list[tuple[str, bytes]] = []
        if self.wheel is not None:
            with contextlib.suppress(KeyError):  # the wheel does not ship it: other sources
                candidates.append((f"{self.wheel_path}:{rel}", self.wheel.read(rel)))
        backup = self.backup_dir / rel
        if backup.is_file():
            candidates.append((str(backup), backup.read_bytes()))
        current = self.site_packages / rel
        if current.is_file():
            candidates.append((str(current), current.read_bytes()))
        for _, data in candidates:
            if record_hash(data) == want:
                return data
        tried = ", ".join(src for src, _ in candidates) or "nothing"
        raise PatchError(
            f"no pristine copy of {rel} (RECORD says {want}; tried {tried}): reinstall the package "
            "(pip install --force-reinstall --no-deps) or pass the wheel file, then re-run"
        )


def _compile_check(rel: str, text: str, patch_names: list[str]) -> None:
    if not rel.endswith(".py"):
        return
    try:
        compile(text, rel, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PatchError(
            f"{', '.join(patch_names)}: {rel} does not compile after patching (line {exc.lineno}: {exc.msg})"
        ) from exc


def _drop_bytecode(path: Path) -> None:
    """Remove cached bytecode of a rewritten module, so no stale .pyc outlives its source."""
    cache = path.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)


def _up_to_date(marker: dict[str, Any] | None, identity: dict[str, Any], site_packages: Path) -> bool:
    if marker is None or any(marker.get(k) != v for k, v in identity.items()):
        return False
    for rel, state in marker.get("files", {}).items():
        path = site_packages / rel
        if not path.is_file() or sha256_hex(path.read_bytes()) != state.get("patched_sha256"):
            return False
    return True


def apply_series(
    site_packages: Path,
    series_dir: Path,
    marker: Path,
    pristine_dir: Path,
    package: str,
    version: str,
    wheel: Path | None = None,
    check_mode: bool = False,
) -> SeriesResult:
    """Bring `package` in `site_packages` to exactly pristine + `series_dir`'s series. See module doc."""
    raw, warnings = load_series(series_dir)
    patches = parse_series(raw)
    dist_info = find_dist_info(site_packages, package, version)
    record = read_record(dist_info)
    old = _load_marker(marker)
    series_id = [{"name": p.name, "sha256": p.sha256} for p in patches]
    identity = {"format": MARKER_FORMAT, "package": package, "version": version, "patches": series_id}
    targets: dict[str, list[str]] = {}
    for p in patches:
        for fp in p.files:
            targets.setdefault(fp.path, []).append(p.name)
    patched_abs = sorted(str(site_packages / rel) for rel in targets)

    if _up_to_date(old, identity, site_packages):
        return SeriesResult(
            changed=False,
            action="unchanged",
            patches=series_id,
            patched_files=patched_abs,
            warnings=warnings,
            msg=f"{package} {version}: series of {len(patches)} patch(es) already applied",
        )

    old_files: dict[str, Any] = (old or {}).get("files", {}) if old else {}
    pristine = _Pristine(site_packages, record, pristine_dir, wheel)
    base: dict[str, bytes | None] = {}
    for rel in sorted(set(old_files) | set(targets)):
        data = pristine.get(rel)
        if data is None and rel not in old_files and (site_packages / rel).exists():
            raise PatchError(
                f"{', '.join(targets[rel])}: would create {rel}, which exists but is neither in the "
                "wheel's RECORD nor created by an earlier series: remove it or reinstall the package"
            )
        base[rel] = data

    content: dict[str, str | None] = {
        rel: (None if data is None else data.decode("utf-8")) for rel, data in base.items()
    }
    for p in patches:
        for fp in p.files:
            content[fp.path] = apply_file_patch(content[fp.path], fp, p.name)
    for rel, names in targets.items():
        _compile_check(rel, content[rel] or "", names)

    desired: dict[str, bytes | None] = {}
    for rel in base:
        text = content[rel]
        desired[rel] = text.encode("utf-8") if rel in targets and text is not None else base[rel]

    written, restored = [], []
    for rel, data in desired.items():
        path = site_packages / rel
        current = path.read_bytes() if path.is_file() else None
        if current == data:
            continue
        written.append(str(path))
        if rel not in targets:
            restored.append(str(path))
    action = "applied" if old is None else ("reapplied" if old.get("patches") != series_id else "repaired")
    files_state = {
        rel: {
            "pristine_sha256": None if base[rel] is None else sha256_hex(base[rel] or b""),
            "patched_sha256": sha256_hex(desired[rel] or b""),
            "patches": targets[rel],
        }
        for rel in targets
    }
    new_marker = {**identity, "dist_info": dist_info.name, "files": files_state}
    if not check_mode:
        for rel, data in base.items():
            backup = pristine_dir / rel
            if data is not None and not backup.is_file():
                write_atomic(backup, data, mode=0o644)
        for rel, data in desired.items():
            path = site_packages / rel
            current = path.read_bytes() if path.is_file() else None
            if current == data:
                continue
            if data is None:
                path.unlink(missing_ok=True)
            else:
                mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
                write_atomic(path, data, mode=mode)
            _drop_bytecode(path)
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(marker, json.dumps(new_marker, indent=2, sort_keys=True) + "\n", mode=0o644)
    applied = ", ".join(p.name for p in patches) or "no patches"
    return SeriesResult(
        changed=True,
        action=action,
        patches=series_id,
        patched_files=patched_abs,
        restored_files=sorted(restored),
        written_files=sorted(written),
        warnings=warnings,
        msg=f"{package} {version}: {action} {applied}; {len(written)} file(s) written",
    )
