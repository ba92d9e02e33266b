"""The release operations the pd_release module runs on a host, on paths it is given.

- `stage`: record the release the just-rendered programs make, refuse it (and put the running
  release's sections back) when it would switch to an SGLang venv that is not installed, a checkpoint
  revision that is not verified, or a release that already failed its gates;
- `accept` / `fail`: after validation; accepting prunes old releases;
- `put_back`: write an earlier release's program sections back for a rollback (the rollout then
  restarts what differs, and `activate` makes it current again);
- `status`: what `pd-appliance status` and the validation report show.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_appliance.files import write_atomic
from pd_appliance.release.errors import ReleaseError
from pd_appliance.release.inspect import checkpoint_part, sglang_part
from pd_appliance.release.record import Release, compare, variant_part
from pd_appliance.release.store import FAILED, ReleaseStore


@dataclass
class HostPaths:
    """Where this host keeps its releases and its supervisor program sections."""

    state_dir: Path  # release_state_dir
    conf_dir: Path  # supervisor conf.d: <program>.conf and the group file
    group_file: str = "00-group-pd.conf"


def installed_parts(
    venv: Path, sglang_version: str, series: list[dict[str, str]], model_dir: Path, repo_id: str
) -> dict[str, Any]:
    """The sglang and checkpoint parts as installed; a part that is not there says so (installed: false).
    A host that runs only the router uses neither: call with workers=False through `stage`."""
    return {
        "sglang": _as_installed(
            lambda: sglang_part(venv, sglang_version, series),
            {"version": sglang_version, "build": venv.name, "venv": str(venv), "series": series},
        ),
        "checkpoint": _as_installed(
            lambda: checkpoint_part(model_dir, repo_id),
            {"repo_id": repo_id, "revision": model_dir.name, "dir": str(model_dir)},
        ),
    }


def _as_installed(read: Callable[[], dict[str, Any]], expected: dict[str, Any]) -> dict[str, Any]:
    """The part as `read` finds it installed, or what was `expected` with why it is not there."""
    try:
        return {**read(), "installed": True}
    except ReleaseError as exc:
        return {**expected, "installed": False, "problem": exc.message}


def read_sections(paths: HostPaths, programs: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Each program's rendered section (conf.d/<name>.conf), role and health URL; and the group file."""
    out = {}
    for name, meta in sorted(programs.items()):
        path = paths.conf_dir / f"{name}.conf"
        try:
            section = path.read_text()
        except OSError as exc:
            raise ReleaseError(
                f"{path}: {exc.strerror}; the serving role renders it before recording the release"
            ) from exc
        out[name] = {
            "role": meta.get("role") or name,
            "health_url": meta.get("health_url") or "",
            "section": section,
        }
    group = paths.conf_dir / paths.group_file
    return out, group.read_text() if group.is_file() else ""


def stage(
    paths: HostPaths,
    parts: dict[str, Any],
    programs: dict[str, dict[str, Any]],
    variant: dict[str, Any] | None,
    *,
    retry_failed: bool = False,
    dry_run: bool = False,
    supervisor: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record and make current the release of the rendered programs; see the module docstring.
    `supervisor` ({serverurl, conf_dir, group}) is kept in the state for a rollback run by another play."""
    store = ReleaseStore(paths.state_dir, dry_run=dry_run)
    sections, group = read_sections(paths, programs)
    release = Release(parts={**parts, "variant": variant_part(variant), "programs": sections, "group": group})
    current = store.current()
    problems = refusals(store, current, release, retry_failed=retry_failed)
    if problems:
        restored = put_back(paths, current, release, dry_run=dry_run) if current is not None else []
        tail = (
            f" The sections of the running release {current.id} were put back ({len(restored)} file(s));"
            " nothing was restarted."
            if current is not None
            else " Nothing was started."
        )
        raise ReleaseError(" ".join(problems) + tail)
    previous, change = store.stage(release, supervisor)
    return {
        "release": release.to_dict(),
        "previous": previous.id if previous else None,
        "change": change.to_dict(),
        "status": store.status_of(release.id) or "candidate",
        "host_state": store.pointers(),
        "changed": previous is None or previous.id != release.id,
        "warnings": [
            p["problem"] for p in (release.parts["sglang"], release.parts["checkpoint"]) if p.get("problem")
        ],
    }


def refusals(store: ReleaseStore, current: Release | None, new: Release, *, retry_failed: bool) -> list[str]:
    """Why `new` must not replace `current`: an uninstalled part it switches to, or an earlier failure."""
    out = []
    for key, what in (("sglang", "SGLang venv"), ("checkpoint", "checkpoint revision")):
        part = new.parts.get(key) or {}
        if part.get("installed", True):
            continue
        same = (
            current is not None and compare(current, Release(parts={**current.parts, key: part})).parts == []
        )
        if current is not None and not same:
            out.append(
                f"Refused: release {new.id} would switch the running release {current.id} to a {what} that"
                f" is not ready: {part.get('problem')}"
            )
    info = store.info(new.id)
    if info.get("status") == FAILED and not retry_failed and (current is None or current.id != new.id):
        out.append(
            f"Refused: release {new.id} ({new.label}) failed validation at {info.get('failed')}:"
            f" {info.get('reason')}"
            " Change the inventory, or set release_retry_failed=true to deploy and validate it again."
        )
    return out


def put_back(
    paths: HostPaths, target: Release, replacing: Release | None, *, dry_run: bool = False
) -> list[str]:
    """Write `target`'s program sections and group file into conf.d; remove sections of programs it does
    not have (those of `replacing`, and any of the names it knows). Returns the files written or removed."""
    touched = []
    names = set(target.programs) | set((replacing.programs if replacing else {}) or {})
    template = _any_section(paths.conf_dir, names)
    for name in sorted(names):
        path = paths.conf_dir / f"{name}.conf"
        if name in target.programs:
            text = target.programs[name]["section"]
            if not path.is_file() or path.read_text() != text:
                touched.append(str(path))
                if not dry_run:
                    _write_like(path, text, template)
        elif path.exists():
            touched.append(str(path))
            if not dry_run:
                path.unlink()
    group = paths.conf_dir / paths.group_file
    if target.parts.get("group") and (not group.is_file() or group.read_text() != target.parts["group"]):
        touched.append(str(group))
        if not dry_run:
            _write_like(group, target.parts["group"], template)
    return touched


def usable(release: Release) -> str | None:
    """Why `release` cannot be put back (its venv or its checkpoint revision is gone), or None."""
    sg, ck = release.parts.get("sglang") or {}, release.parts.get("checkpoint") or {}
    if sg.get("venv") and not (Path(sg["venv"]) / "bin").is_dir():
        return f"its SGLang venv {sg['venv']} was removed"
    if ck.get("dir") and not Path(ck["dir"]).is_dir():
        return f"its checkpoint revision {ck['dir']} was removed"
    return None


def _any_section(conf_dir: Path, names: set[str]) -> Path | None:
    for name in sorted(names):
        if (conf_dir / f"{name}.conf").is_file():
            return conf_dir / f"{name}.conf"
    return None


def _write_like(path: Path, text: str, template: Path | None) -> None:
    """Write `text` to `path` atomically with the owner, group and mode of `template` (or of `path`)."""
    ref = path if path.exists() else template
    st = ref.stat() if ref is not None else None
    if st is None:  # neither exists: mkstemp's own mode, as before
        write_atomic(path, text, mode=0o600, make_parents=False)
        return
    owner = (st.st_uid, st.st_gid) if os.geteuid() == 0 else None
    write_atomic(path, text, mode=st.st_mode & 0o777, owner=owner, make_parents=False)


def rollback_plan(
    paths: HostPaths, to: str | None = None
) -> tuple[ReleaseStore, Release, Release | None, list[str]]:
    """The store, the release to put back (`to`, else the newest accepted one that is not current and
    still installed), the current release, and why newer accepted ones were passed over."""
    store = ReleaseStore(paths.state_dir)
    current = store.current()
    if to:
        target = store.record(to)
        if target is None:
            raise ReleaseError(f"release {to} is not recorded on this host ({paths.state_dir}/records)")
        why = usable(target)
        if why:
            raise ReleaseError(f"release {to} cannot be put back: {why}")
        return store, target, current, []
    target, skipped = store.rollback_target(usable)
    if target is None:
        known = ", ".join(store.accepted()) or "none"
        raise ReleaseError(
            f"no earlier accepted release can be put back on this host (current {store.current_id}, accepted:"
            f" {known}{'; ' + '; '.join(skipped) if skipped else ''}): raise release_keep to keep more"
        )
    return store, target, current, skipped
