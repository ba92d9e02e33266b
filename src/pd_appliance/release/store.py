"""A host's release state: records, the current release, what was accepted or failed, and pruning.

Layout under the state directory (release_state_dir):

    records/<id>.json   every release this host ran (parts, label), written once
    state.json          current id; per release its status (candidate, accepted, failed, pruned)
                        with times and the failure reason; accepted ids, newest first
    history.jsonl       one line per event (staged, accepted, failed, rolled back, pruned)

Every write goes to a temporary name and is renamed into place, so a crash never leaves a torn file.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pd_appliance.files import write_atomic
from pd_appliance.release.errors import ReleaseError
from pd_appliance.release.record import Change, Release, compare

CANDIDATE, ACCEPTED, FAILED, PRUNED = "candidate", "accepted", "failed", "pruned"
# Records of releases that were never accepted (A/B candidates, failures) kept for the history.
MAX_UNACCEPTED_RECORDS = 50


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class PruneResult:
    """What pruning did (or would do in check mode)."""

    pruned: list[str] = field(default_factory=list)
    removed_paths: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    free_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ReleaseStore:
    """The release state of one host, in `root` (release_state_dir)."""

    def __init__(self, root: Path, *, dry_run: bool = False, clock: Callable[[], str] = now_iso) -> None:
        self.root = root
        self.dry_run = dry_run
        self.clock = clock
        self.state = self._load_state()

    # ---- reading ----------------------------------------------------------------------------
    def _load_state(self) -> dict[str, Any]:
        path = self.root / "state.json"
        try:
            state: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return {"current": None, "accepted": [], "releases": {}}
        except (OSError, json.JSONDecodeError) as exc:
            raise ReleaseError(
                f"{path} is unreadable ({exc}): restore it from history.jsonl or remove it"
            ) from exc
        state.setdefault("accepted", [])
        state.setdefault("releases", {})
        state.setdefault("current", None)
        return state

    def record(self, release_id: str | None) -> Release | None:
        if not release_id:
            return None
        try:
            return Release.from_dict(json.loads((self.root / "records" / f"{release_id}.json").read_text()))
        except (OSError, json.JSONDecodeError, KeyError):
            return None

    @property
    def current_id(self) -> str | None:
        return self.state.get("current")

    def current(self) -> Release | None:
        return self.record(self.current_id)

    def status_of(self, release_id: str | None) -> str | None:
        return (self.state["releases"].get(release_id or "") or {}).get("status")

    def info(self, release_id: str | None) -> dict[str, Any]:
        return dict(self.state["releases"].get(release_id or "") or {})

    def accepted(self) -> list[str]:
        """Accepted releases not pruned, newest acceptance first."""
        return [r for r in self.state["accepted"] if self.status_of(r) == ACCEPTED]

    def rollback_target(
        self, usable: Callable[[Release], str | None] | None = None
    ) -> tuple[Release | None, list[str]]:
        """The newest accepted release other than the current one that can be put back.

        `usable(release)` returns why one cannot (its venv or revision was removed), or None.
        Returns the release (or None) and the reasons the newer candidates were passed over.
        """
        skipped = []
        for rid in self.accepted():
            if rid == self.current_id:
                continue
            release = self.record(rid)
            if release is None:
                skipped.append(f"{rid}: its record is missing")
                continue
            why = usable(release) if usable else None
            if why:
                skipped.append(f"{rid}: {why}")
                continue
            return release, skipped
        return None, skipped

    def pointers(self) -> dict[str, Any]:
        """What the host state (pd_appliance.host_state, key `release`) says of this host's releases:
        the release in force, its status and label, and the newest accepted one (a rollback's start).
        Every play reads these from ansible_local.pd_appliance; the records stay here."""
        current = self.current()
        accepted = self.accepted()
        return {
            "current": self.current_id,
            "status": self.status_of(self.current_id),
            "label": current.label if current else None,
            "accepted": accepted[0] if accepted else None,
        }

    def summary(self) -> dict[str, Any]:
        """What `pd-appliance status` and the validation report show."""
        current = self.current()
        target, _ = self.rollback_target()
        accepted = [
            {"id": rid, "label": (self.record(rid) or Release(parts={}, id=rid)).label, **self.info(rid)}
            for rid in self.accepted()
        ]
        return {
            "supervisor": self.state.get("supervisor") or {},
            "current": current.to_dict() if current else None,
            "current_status": self.status_of(self.current_id),
            "current_info": self.info(self.current_id),
            "rollback_target": target.id if target else None,
            "accepted": accepted,
            "failed": {rid: i for rid, i in self.state["releases"].items() if i.get("status") == FAILED},
        }

    # ---- changing ---------------------------------------------------------------------------
    def stage(
        self, release: Release, supervisor: dict[str, Any] | None = None
    ) -> tuple[Release | None, Change]:
        """Make `release` the current one (its programs are about to run); returns the previous one and
        what changed. A release seen before keeps its status (accepted stays accepted). `supervisor`
        says where its programs run (serverurl, conf_dir), for a rollback from another play."""
        previous = self.current()
        if supervisor:
            self.state["supervisor"] = supervisor
        change = compare(previous, release)
        release.created = release.created or self.clock()
        if self.record(release.id) is None:
            self._write_json(self.root / "records" / f"{release.id}.json", release.to_dict())
        info = self.state["releases"].setdefault(release.id, {"status": CANDIDATE, "staged": self.clock()})
        if info.get("status") == PRUNED:
            info["status"] = CANDIDATE
        if self.current_id != release.id:
            self.state["current"] = release.id
            info["staged"] = self.clock()
            self._event(
                "staged", release.id, previous=previous.id if previous else None, changed=change.parts
            )
        self._save()
        return previous, change

    def accept(self, release_id: str) -> None:
        info = self._known(release_id)
        if info.get("status") != ACCEPTED:
            info.update(status=ACCEPTED, accepted=self.clock())
            info.pop("reason", None)
            self._event("accepted", release_id)
        accepted = [r for r in self.state["accepted"] if r != release_id]
        self.state["accepted"] = [release_id, *accepted]
        self._save()

    def fail(self, release_id: str, reason: str) -> None:
        info = self._known(release_id)
        info.update(status=FAILED, failed=self.clock(), reason=reason)
        self.state["accepted"] = [r for r in self.state["accepted"] if r != release_id]
        self._event("failed", release_id, reason=reason)
        self._save()

    def activate(self, release_id: str, why: str) -> None:
        """Make an earlier release current again (a rollback put its programs back)."""
        if self.record(release_id) is None:
            raise ReleaseError(f"release {release_id} has no record in {self.root}/records")
        previous = self.current_id
        self.state["current"] = release_id
        self._event("rolled back", release_id, previous=previous, reason=why)
        self._save()

    def _known(self, release_id: str) -> dict[str, Any]:
        info: dict[str, Any] | None = self.state["releases"].get(release_id)
        if info is None:
            raise ReleaseError(
                f"release {release_id} is not recorded in {self.root}: nothing to accept or fail"
            )
        return info

    # ---- pruning ----------------------------------------------------------------------------
    def prune(
        self,
        keep: int,
        keep_revisions: int,
        venvs_root: Path,
        model_root: Path,
        *,
        min_free_bytes: int = 0,
        free_bytes: Callable[[Path], int] | None = None,
    ) -> PruneResult:
        """Keep the `keep` newest accepted releases (the current one always) and the checkpoint revisions
        of the `keep_revisions` newest of them; while the model filesystem has less than `min_free_bytes`
        free, drop the oldest kept release too (never the current one). Venvs and revision directories no
        kept release (and not the current one) uses are removed, only under `venvs_root` / `model_root`."""
        if keep < 1 or keep_revisions < 1:
            raise ReleaseError(
                f"release_keep={keep} and release_keep_checkpoint_revisions={keep_revisions} must be >= 1"
                " (the current release is always kept)"
            )
        result = PruneResult()
        free_of = free_bytes or (lambda p: shutil.disk_usage(_existing(p)).free)
        current = self.current()
        order = self.accepted()
        if current is not None and current.id not in order:
            order = [current.id, *order]
        kept = _with_first(order[:keep], current.id if current else None)
        kept = self._limit_revisions(kept, keep_revisions, current)
        dropped = [r for r in order if r not in kept]
        while True:
            removals = self._removals(kept, dropped, current, venvs_root, model_root)
            result.free_bytes = free_of(model_root) + sum(_size(p) for p in removals)
            if result.free_bytes >= min_free_bytes or len(kept) <= 1:
                break
            victim = kept.pop()  # the oldest; the current release is first and never goes
            dropped.append(victim)
            result.notes.append(
                f"{victim} pruned before its turn: {model_root} would have {result.free_bytes} bytes free,"
                f" release_min_free_bytes is {min_free_bytes}"
            )
        if result.free_bytes < min_free_bytes:
            result.notes.append(
                f"only the current release is kept and {model_root} still has {result.free_bytes} bytes free"
                f" (release_min_free_bytes {min_free_bytes}): free space on that filesystem"
            )
        for rid in dropped:
            if self.status_of(rid) == ACCEPTED:
                self.state["releases"][rid].update(status=PRUNED, pruned=self.clock())
                self._event("pruned", rid)
                result.pruned.append(rid)
        self.state["accepted"] = [r for r in self.state["accepted"] if r in kept]
        result.kept = kept
        result.removed_paths = [str(p) for p in removals]
        if not self.dry_run:
            for path in removals:
                shutil.rmtree(path, ignore_errors=False)
            self._forget_refs(model_root, removals)
        self._drop_old_records(kept)
        self._save()
        return result

    def _limit_revisions(self, kept: list[str], keep_revisions: int, current: Release | None) -> list[str]:
        revisions: list[str] = []
        if current is not None:
            revisions.append(_revision_dir(current))
        out = []
        for rid in kept:
            release = self.record(rid)
            rev = _revision_dir(release) if release else ""
            if rev not in revisions:
                if len(revisions) >= keep_revisions:
                    continue
                revisions.append(rev)
            out.append(rid)
        return out

    def _removals(
        self, kept: list[str], dropped: list[str], current: Release | None, venvs_root: Path, model_root: Path
    ) -> list[Path]:
        in_use: set[str] = set()
        for release in [self.record(r) for r in kept] + [current]:
            if release is not None:
                in_use |= {_venv(release), _revision_dir(release)}
        out: list[Path] = []
        for rid in dropped:
            release = self.record(rid)
            if release is None:
                continue
            for raw, root in ((_venv(release), venvs_root), (_revision_dir(release), model_root)):
                path = Path(raw) if raw else None
                if path is None or raw in in_use or path in out or not path.is_dir():
                    continue
                if path.parent.resolve() != root.resolve():
                    continue  # never outside the directories releases are installed in
                out.append(path)
        return out + self._build_cache_removals(kept, dropped, current)

    def _build_cache_removals(
        self, kept: list[str], dropped: list[str], current: Release | None
    ) -> list[Path]:
        """The SGLang-build cache directories (the `caches` part) no kept release uses, as their venvs.

        Only a directory named like its release's build, under that release's recorded cache root."""
        in_use = {_build_cache(r) for r in [self.record(k) for k in kept] + [current] if r is not None}
        out: list[Path] = []
        for rid in dropped:
            release = self.record(rid)
            raw = _build_cache(release) if release is not None else ""
            if not raw or raw in in_use or release is None:
                continue
            path = Path(raw)
            caches = release.parts.get("caches") or {}
            build = str((release.parts.get("sglang") or {}).get("build") or "")
            root = Path(str(caches.get("root") or "/nonexistent"))
            if path.name != build or not path.is_dir() or path in out:
                continue
            if root.resolve() not in path.resolve().parents:
                continue
            out.append(path)
        return out

    def _forget_refs(self, model_root: Path, removed: list[Path]) -> None:
        gone = {p.name for p in removed if p.parent.resolve() == model_root.resolve()}
        refs = model_root / "refs"
        if not gone or not refs.is_dir():
            return
        for ref in refs.rglob("*"):
            if ref.is_file() and ref.read_text().strip() in gone:
                ref.unlink()

    def _drop_old_records(self, kept: list[str]) -> None:
        unaccepted = sorted(
            (i.get("staged", ""), rid)
            for rid, i in self.state["releases"].items()
            if rid not in kept and rid != self.current_id and i.get("status") in (CANDIDATE, PRUNED)
        )
        for _, rid in unaccepted[: max(0, len(unaccepted) - MAX_UNACCEPTED_RECORDS)]:
            del self.state["releases"][rid]
            if not self.dry_run:
                (self.root / "records" / f"{rid}.json").unlink(missing_ok=True)

    # ---- files ------------------------------------------------------------------------------
    def _event(self, event: str, release_id: str, **detail: Any) -> None:
        line = json.dumps(
            {"time": self.clock(), "event": event, "release": release_id, **detail}, sort_keys=True
        )
        if self.dry_run:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / "history.jsonl").open("a") as fh:
            fh.write(line + "\n")

    def _save(self) -> None:
        self._write_json(self.root / "state.json", self.state)

    def _write_json(self, path: Path, data: Any) -> None:
        if self.dry_run:
            return
        write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o644)


def _venv(release: Release) -> str:
    return str((release.parts.get("sglang") or {}).get("venv") or "")


def _build_cache(release: Release) -> str:
    return str((release.parts.get("caches") or {}).get("sglang_build_dir") or "")


def _revision_dir(release: Release) -> str:
    return str((release.parts.get("checkpoint") or {}).get("dir") or "")


def _with_first(ids: list[str], first: str | None) -> list[str]:
    if first is None:
        return list(ids)
    return [first, *[r for r in ids if r != first]]


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if st.st_nlink == 1:  # a hard link shared with a kept revision frees nothing
                total += st.st_size
    return total
