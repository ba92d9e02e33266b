"""Bring a checkpoint directory to a verified state, or say exactly why it is not.

`ensure_checkpoint` is what the pd_hf_checkpoint module runs; `verify_directory` is what
`pd-checkpoint verify` runs. Both share one verification: every file's size and bytes against
what it must be (the Hub's LFS sha256, or git blob id for small files; the manifest offline),
a stat-only shortcut for files unchanged since their last hash, and structural checks of the
safetensors headers and the shard index. A file that fails is fetched once more into a partial
file under `.pd-appliance-partial/` (resumable, keyed by the content hash so it can never be
appended to a different file), re-hashed, and only then renamed over the final name.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pd_appliance.checkpoint import revisions
from pd_appliance.checkpoint.errors import CheckpointError, CheckpointIntegrityError, FileProblem
from pd_appliance.checkpoint.hashing import FileDigest, HashJob, default_workers, hash_file, hash_files
from pd_appliance.checkpoint.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestEntry,
    ManifestError,
    load_manifest,
    write_manifest,
)
from pd_appliance.checkpoint.safetensors_format import (
    INDEX_SUFFIX,
    SafetensorsFormatError,
    check_index,
    read_safetensors_summary,
)
from pd_appliance.files import fsync_directory, temporary_prefix

if TYPE_CHECKING:  # huggingface_hub is imported only when the Hub is used (never offline)
    from pd_appliance.checkpoint.hub import HubSource

PARTIAL_DIR = ".pd-appliance-partial"
# Names in the checkpoint directory that are bookkeeping, not checkpoint files.
BOOKKEEPING = frozenset({MANIFEST_NAME, PARTIAL_DIR, ".cache"})
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# Free space kept beyond the bytes a fetch needs, so a download never fills the filesystem.
DISK_RESERVE_BYTES = 1 << 30
VerifyMode = Literal["auto", "full"]
# progress_factory(total_bytes, description) -> callback(bytes_done_increment)
ProgressFactory = Callable[[int, str], Callable[[int], None]]


@dataclass(frozen=True)
class ExpectedFile:
    """What one file must be. `sha256` is known for LFS files (Hub) and for every file offline (manifest)."""

    path: str
    size: int
    sha256: str | None
    git_blob_id: str | None
    lfs: bool

    def matches_entry(self, entry: ManifestEntry) -> bool:
        return (
            entry.size == self.size
            and entry.lfs == self.lfs
            and (self.sha256 is None or entry.sha256 == self.sha256)
            and (self.git_blob_id is None or entry.git_blob_id == self.git_blob_id)
        )

    def problem_with(self, digest: FileDigest) -> FileProblem | None:
        if digest.size != self.size:
            return FileProblem(
                self.path, f"{digest.size} bytes, expected {self.size}", self.sha256, digest.sha256
            )
        if self.sha256 is not None and digest.sha256 != self.sha256:
            return FileProblem(self.path, "sha256 mismatch", self.sha256, digest.sha256)
        if not self.lfs and self.git_blob_id is not None and digest.git_sha1 != self.git_blob_id:
            return FileProblem(
                self.path,
                f"git blob id {digest.git_sha1}, expected {self.git_blob_id}",
                self.sha256,
                digest.sha256,
            )
        return None

    def entry_for(self, digest: FileDigest) -> ManifestEntry:
        return ManifestEntry(
            size=digest.size,
            sha256=digest.sha256,
            git_blob_id=self.git_blob_id,
            lfs=self.lfs,
            mtime_ns=digest.mtime_ns,
            inode=digest.inode,
        )

    @property
    def content_key(self) -> str:
        return self.sha256 or self.git_blob_id or self.path.replace("/", "_")


@dataclass
class CheckpointRequest:
    """Everything the module's arguments carry (see roles/checkpoint/defaults/main.yml)."""

    repo_id: str
    revision: str
    directory: Path
    endpoint: str = "https://huggingface.co"
    offline: bool = False
    token: str | None = field(default=None, repr=False)
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None
    verify: VerifyMode = "auto"
    hash_workers: int = 0
    download_workers: int = 8
    owner: str | None = None
    group: str | None = None
    check_mode: bool = False
    disk_reserve_bytes: int = DISK_RESERVE_BYTES
    # Revision directories (checkpoint_root): `directory` becomes <root>/<commit> (ensure_revision).
    root: Path | None = None
    # The commit `revision` was resolved to (ensure_revision sets it, so it is resolved once).
    commit: str | None = None


@dataclass
class CheckpointReport:
    """What happened, for the module's result and the CLI's summary."""

    changed: bool = False
    directory: str = ""
    repo_id: str = ""
    revision: str = ""
    revision_requested: str = ""
    endpoint: str = ""
    offline: bool = False
    files: int = 0
    total_bytes: int = 0
    fetched: list[str] = field(default_factory=list)
    would_fetch: list[str] = field(default_factory=list)
    verified_by_stat: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0
    hash_seconds: float = 0.0
    manifest_written: bool = False
    reused: list[str] = field(default_factory=list)
    ref_written: bool = False
    ownership_changed: bool = False
    transfer_backend: str = ""
    extra_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def hash_mb_s(self) -> float:
        return self.hashed_bytes / 1e6 / self.hash_seconds if self.hash_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        data = dict(self.__dict__)
        data["hash_mb_s"] = round(self.hash_mb_s, 1)
        data["hash_seconds"] = round(self.hash_seconds, 3)
        return data


@dataclass
class _Verification:
    entries: dict[str, ManifestEntry] = field(default_factory=dict)
    problems: dict[str, FileProblem] = field(default_factory=dict)
    by_stat: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0
    seconds: float = 0.0


def ensure_checkpoint(
    request: CheckpointRequest, *, progress: ProgressFactory | None = None
) -> CheckpointReport:
    """Download what is missing or wrong, verify everything, record the manifest, set ownership."""
    directory = request.directory
    report = CheckpointReport(
        directory=str(directory),
        repo_id=request.repo_id,
        revision_requested=request.revision,
        endpoint=request.endpoint,
        offline=request.offline,
    )
    uid, gid = _resolve_owner(request.owner, request.group)
    if not directory.is_dir():
        if request.offline:
            raise CheckpointError(
                f"checkpoint_offline is true but checkpoint_dir {directory} does not exist. Fix: pre-seed it"
                " (copy a verified checkpoint including its manifest), or set checkpoint_offline: false."
            )
        report.changed = True
        if request.check_mode:
            report.warnings.append(f"{directory} would be created and the whole checkpoint fetched")
            return report
        directory.mkdir(mode=0o755, parents=True)
    old_manifest = _load_manifest_or_warn(directory, report)
    if request.offline:
        expected, commit = _expected_offline(request, old_manifest)
        report.transfer_backend = "none (offline)"
    else:
        expected, commit, source = _expected_online(request, report)
    report.revision = commit
    report.files = len(expected)
    report.total_bytes = sum(f.size for f in expected.values())

    checked = _verify(directory, expected, old_manifest, commit, request, progress)
    report.verified_by_stat, report.hashed_files = checked.by_stat, checked.hashed_files
    report.hashed_bytes, report.hash_seconds = checked.hashed_bytes, checked.seconds

    if checked.problems:
        if request.offline:
            raise CheckpointIntegrityError(
                f"checkpoint_offline is true, so nothing is fetched, and {len(checked.problems)} file(s) in"
                f" {directory} fail verification against {MANIFEST_NAME}. Fix: restore them from a verified"
                " copy, or run with checkpoint_offline: false to re-fetch them:",
                sorted(checked.problems.values(), key=lambda p: p.path),
            )
        names = sorted(checked.problems)
        if request.check_mode:
            report.would_fetch = names
            report.changed = True
            return report
        if request.root is not None:
            _reuse(request.root, directory, expected, names, checked, report, request, uid, gid)
            names = sorted(checked.problems)
        if names:
            _fetch_all(source, request, expected, names, commit, checked, report, uid, gid)

    unselected = set(old_manifest.unselected) if request.offline and old_manifest else set()
    if not request.offline:
        unselected = set(source.unselected)
    _check_structure(directory, expected, commit, unselected, report.warnings)
    new_manifest = Manifest(
        repo_id=request.repo_id,
        revision=commit,
        # Offline proves the same revision again: keep the name it was downloaded under.
        revision_requested=old_manifest.revision_requested
        if request.offline and old_manifest
        else request.revision,
        endpoint=request.endpoint if not request.offline else (old_manifest.endpoint if old_manifest else ""),
        files=checked.entries,
        unselected=sorted(unselected),
    )
    if not new_manifest.same_content(old_manifest):
        report.manifest_written = True
        if not request.check_mode:
            write_manifest(directory, new_manifest)
    report.ownership_changed = _apply_ownership(directory, expected, uid, gid, dry_run=request.check_mode)
    report.extra_files = _extra_files(directory, expected)
    if report.extra_files:
        report.warnings.append(
            f"{len(report.extra_files)} file(s) in {directory} are not part of {request.repo_id}@{commit}"
            f" and were left alone (first: {report.extra_files[0]})"
        )
    if not request.offline and not COMMIT_RE.match(request.revision):
        report.warnings.append(
            f"checkpoint_revision {request.revision!r} is not a commit; it resolved to {commit}. Pin"
            f" checkpoint_revision: {commit} so every host and every re-run gets the same bytes."
        )
    if not request.check_mode:
        _clean_partials(directory, expected)
    report.changed = (
        report.changed
        or bool(report.fetched)
        or bool(report.reused)
        or report.manifest_written
        or report.ownership_changed
    )
    return report


def ensure_revision(
    request: CheckpointRequest, *, progress: ProgressFactory | None = None
) -> CheckpointReport:
    """ensure_checkpoint into <request.root>/<commit>, the commit `request.revision` names now (or,
    offline, the one recorded or pre-seeded); a branch or tag is recorded in <root>/refs/ once its
    revision is verified. See pd_appliance.checkpoint.revisions."""
    root = request.root
    if root is None:
        raise CheckpointError("ensure_revision needs request.root (checkpoint_root)")
    if request.offline:
        commit = revisions.resolve_offline(root, request.revision)
    else:
        from pd_appliance.checkpoint.hub import HubSource

        commit = HubSource(request.repo_id, endpoint=request.endpoint, token=request.token).resolve(
            request.revision
        )
    report = ensure_checkpoint(replace(request, directory=root / commit, commit=commit), progress=progress)
    if not request.check_mode and report.revision:
        uid, gid = _resolve_owner(request.owner, request.group)
        report.ref_written = revisions.write_ref(root, request.revision, report.revision, uid, gid)
        report.changed = report.changed or report.ref_written
    return report


def verify_directory(
    directory: Path,
    *,
    full: bool = True,
    workers: int = 0,
    progress: ProgressFactory | None = None,
) -> CheckpointReport:
    """Verify `directory` against its own manifest, fetching nothing and writing nothing."""
    manifest = load_manifest(directory)
    if manifest is None:
        raise CheckpointError(
            f"{directory} has no {MANIFEST_NAME}: nothing says what its files must be. Fix: let the"
            " checkpoint role (or `pd-checkpoint download`) download it, which records the manifest."
        )
    request = CheckpointRequest(
        repo_id=manifest.repo_id,
        revision=manifest.revision,
        directory=directory,
        endpoint=manifest.endpoint,
        offline=True,
        verify="full" if full else "auto",
        hash_workers=workers,
        check_mode=True,
    )
    expected, commit = _expected_offline(request, manifest)
    checked = _verify(directory, expected, manifest, commit, request, progress)
    report = CheckpointReport(
        directory=str(directory),
        repo_id=manifest.repo_id,
        revision=commit,
        revision_requested=manifest.revision_requested,
        endpoint=manifest.endpoint,
        offline=True,
        files=len(expected),
        total_bytes=sum(f.size for f in expected.values()),
        verified_by_stat=checked.by_stat,
        hashed_files=checked.hashed_files,
        hashed_bytes=checked.hashed_bytes,
        hash_seconds=checked.seconds,
    )
    if checked.problems:
        raise CheckpointIntegrityError(
            f"{len(checked.problems)} file(s) in {directory} fail verification against {MANIFEST_NAME}:",
            sorted(checked.problems.values(), key=lambda p: p.path),
        )
    _check_structure(directory, expected, commit, set(manifest.unselected), report.warnings)
    report.extra_files = _extra_files(directory, expected)
    return report


def _load_manifest_or_warn(directory: Path, report: CheckpointReport) -> Manifest | None:
    try:
        return load_manifest(directory)
    except ManifestError as err:
        report.warnings.append(f"{err}; every file is re-hashed and the manifest rewritten")
        return None


def _expected_offline(
    request: CheckpointRequest, manifest: Manifest | None
) -> tuple[dict[str, ExpectedFile], str]:
    directory = request.directory
    if manifest is None:
        raise CheckpointError(
            f"checkpoint_offline is true but {directory} has no {MANIFEST_NAME}, so nothing says what its"
            " files must be. Fix: copy the checkpoint directory including its manifest from a host that"
            " downloaded it (rsync -a), or run once with checkpoint_offline: false against the Hub or a"
            " mirror (checkpoint_hf_endpoint)."
        )
    if manifest.repo_id != request.repo_id:
        raise CheckpointError(
            f"{directory} holds {manifest.repo_id}, but checkpoint_repo_id is {request.repo_id}. Fix one of"
            " them."
        )
    wanted = request.revision
    if (
        request.commit != manifest.revision
        and wanted not in (manifest.revision, manifest.revision_requested)
        and not (len(wanted) >= 7 and manifest.revision.startswith(wanted))
    ):
        raise CheckpointError(
            f"{directory} holds {manifest.repo_id} at {manifest.revision} (requested as"
            f" {manifest.revision_requested!r}), but checkpoint_revision is {wanted!r}. Fix: set"
            f" checkpoint_revision: {manifest.revision}, or seed the directory with that revision."
        )
    expected = {
        path: ExpectedFile(path, entry.size, entry.sha256, entry.git_blob_id, entry.lfs)
        for path, entry in manifest.files.items()
    }
    return expected, manifest.revision


def _expected_online(
    request: CheckpointRequest, report: CheckpointReport
) -> tuple[dict[str, ExpectedFile], str, HubSource]:
    from pd_appliance.checkpoint.hub import HubSource, transfer_backend

    source = HubSource(request.repo_id, endpoint=request.endpoint, token=request.token)
    commit = source.resolve(request.commit or request.revision)
    remote, source.unselected = source.list_files(
        commit, allow_patterns=request.allow_patterns, ignore_patterns=request.ignore_patterns
    )
    if not remote:
        raise CheckpointError(
            f"No file of {request.repo_id}@{commit} matches checkpoint_allow_patterns"
            f" {request.allow_patterns} / checkpoint_ignore_patterns {request.ignore_patterns}. Fix the"
            " patterns."
        )
    report.transfer_backend = transfer_backend()
    expected = {
        f.path: ExpectedFile(f.path, f.size, f.lfs_sha256, f.git_blob_id, f.lfs_sha256 is not None)
        for f in remote
    }
    return expected, commit, source


def _verify(
    directory: Path,
    expected: dict[str, ExpectedFile],
    manifest: Manifest | None,
    commit: str,
    request: CheckpointRequest,
    progress: ProgressFactory | None,
) -> _Verification:
    result = _Verification()
    trusted = manifest.files if manifest is not None and manifest.revision == commit else {}
    jobs: list[HashJob] = []
    for path, want in expected.items():
        local = directory / path
        try:
            st = local.stat()
        except FileNotFoundError:
            result.problems[path] = FileProblem(path, "missing", want.sha256)
            continue
        if st.st_size != want.size:
            what = "truncated" if st.st_size < want.size else "too long"
            result.problems[path] = FileProblem(
                path, f"{what}: {st.st_size} bytes, expected {want.size}", want.sha256
            )
            continue
        entry = trusted.get(path)
        if (
            request.verify == "auto"
            and entry is not None
            and want.matches_entry(entry)
            and (entry.mtime_ns, entry.inode) == (st.st_mtime_ns, st.st_ino)
            and _header_still_parses(local)
        ):
            result.entries[path] = entry
            result.by_stat += 1
            continue
        jobs.append(HashJob(path, local, git_sha1=not want.lfs))
    if jobs:
        total = sum(expected[job.key].size for job in jobs)
        callback = progress(total, f"verify {len(jobs)} file(s)") if progress is not None else None
        started = time.perf_counter()
        digests = hash_files(jobs, workers=request.hash_workers or default_workers(), progress=callback)
        result.seconds = time.perf_counter() - started
        result.hashed_files, result.hashed_bytes = len(jobs), total
        for path, digest in digests.items():
            want = expected[path]
            if isinstance(digest, OSError):
                result.problems[path] = FileProblem(path, f"unreadable: {digest}", want.sha256)
            elif (problem := want.problem_with(digest)) is not None:
                result.problems[path] = problem
            else:
                result.entries[path] = want.entry_for(digest)
    return result


def _header_still_parses(local: Path) -> bool:
    """A stat-trusted shard whose header no longer parses was changed behind our back: hash it."""
    if not local.name.endswith(".safetensors"):
        return True
    try:
        read_safetensors_summary(local)
    except (SafetensorsFormatError, OSError):
        return False
    return True


def _fetch_all(
    source: HubSource,
    request: CheckpointRequest,
    expected: dict[str, ExpectedFile],
    names: list[str],
    commit: str,
    checked: _Verification,
    report: CheckpointReport,
    uid: int | None,
    gid: int | None,
) -> None:
    directory = request.directory
    partial_dir = directory / PARTIAL_DIR
    partial_dir.mkdir(mode=0o755, exist_ok=True)
    _chown_if_needed(partial_dir, uid, gid)
    needed = sum(
        max(0, expected[n].size - _size_or_zero(partial_dir / f"{expected[n].content_key}.part"))
        for n in names
    )
    free = shutil.disk_usage(directory).free
    if needed + request.disk_reserve_bytes > free:
        kept = ""
        if request.root is not None:
            others = [p.name for p in revisions.verified_revisions(request.root) if p != directory]
            if others:
                kept = (
                    f" Earlier revisions kept beside it under {request.root}: {', '.join(others)} (removed"
                    " when a release on a newer one is accepted; release_keep_checkpoint_revisions)."
                )
        raise CheckpointError(
            f"{directory} has {free} bytes free; fetching {len(names)} file(s) needs {needed}"
            f" bytes plus a {request.disk_reserve_bytes}-byte reserve.{kept} Fix: free space there, or point"
            " checkpoint_root (appliance_model_root) at a larger filesystem."
        )

    def fetch(name: str) -> tuple[str, ManifestEntry | FileProblem]:
        return name, _fetch_one(source, expected[name], commit, directory, partial_dir, uid, gid)

    workers = max(1, min(request.download_workers, len(names)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pd-fetch") as pool:
        results = list(pool.map(fetch, names))
    still_bad: list[FileProblem] = []
    for name, outcome in results:
        if isinstance(outcome, FileProblem):
            still_bad.append(outcome)
        else:
            checked.entries[name] = outcome
            checked.problems.pop(name, None)
            report.fetched.append(name)
    report.fetched.sort()
    if still_bad:
        raise CheckpointIntegrityError(
            f"{len(still_bad)} file(s) of {request.repo_id}@{commit} still fail verification after a"
            f" re-fetch from {request.endpoint}; the source itself serves wrong bytes (a stale or corrupt"
            " mirror?). Fix: re-sync checkpoint_hf_endpoint, or retry against https://huggingface.co:",
            sorted(still_bad, key=lambda p: p.path),
        )


def _reuse(
    root: Path,
    directory: Path,
    expected: dict[str, ExpectedFile],
    names: list[str],
    checked: _Verification,
    report: CheckpointReport,
    request: CheckpointRequest,
    uid: int | None,
    gid: int | None,
) -> None:
    """Hard-link missing LFS files from verified earlier revisions holding the same bytes, then hash them:
    a new revision that changes a config re-fetches nothing else. What does not verify is fetched."""
    sources = revisions.reuse_sources(root, directory)
    linked: list[HashJob] = []
    for name in names:
        want = expected[name]
        if want.sha256 is None or checked.problems[name].problem != "missing":
            continue
        for source, _rel in sources.get(want.sha256, []):
            if source.stat().st_size == want.size and revisions.link_from(source, directory / name):
                linked.append(HashJob(name, directory / name, git_sha1=False))
                break
    if not linked:
        return
    digests = hash_files(linked, workers=request.hash_workers or default_workers())
    for job in linked:
        digest = digests[job.key]
        problem = None if isinstance(digest, OSError) else expected[job.key].problem_with(digest)
        if isinstance(digest, OSError) or problem is not None:
            job.path.unlink(missing_ok=True)  # the fetch below gets it
            continue
        checked.entries[job.key] = expected[job.key].entry_for(digest)
        checked.problems.pop(job.key, None)
        report.reused.append(job.key)
    report.reused.sort()


def _fetch_one(
    source: HubSource,
    want: ExpectedFile,
    commit: str,
    directory: Path,
    partial_dir: Path,
    uid: int | None,
    gid: int | None,
) -> ManifestEntry | FileProblem:
    """Fetch into the partial file, verify it, and only then rename it over the final name."""
    partial = partial_dir / f"{want.content_key}.part"
    remote = source.files[want.path]
    for attempt in range(2):
        resumed = _size_or_zero(partial) > 0
        source.fetch(remote, commit, partial)
        digest = hash_file(partial, git_sha1=not want.lfs)
        problem = want.problem_with(digest)
        if problem is None:
            break
        partial.unlink(missing_ok=True)
        if not (resumed and attempt == 0):
            # A resumed partial may have carried the bad bytes: one clean fetch before giving up.
            return FileProblem(
                want.path, f"still wrong after a fresh fetch: {problem.problem}", want.sha256, digest.sha256
            )
    final = directory / want.path
    final.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(partial, 0o644)
    _chown_if_needed(partial, uid, gid)
    os.replace(partial, final)
    fsync_directory(final.parent)
    st = final.stat()  # the stat the manifest keeps is the final name's, after the chmod and rename
    return want.entry_for(replace(digest, size=st.st_size, mtime_ns=st.st_mtime_ns, inode=st.st_ino))


def _check_structure(
    directory: Path, expected: dict[str, ExpectedFile], commit: str, unselected: set[str], warnings: list[str]
) -> None:
    """Every shard header parses and fits; every index names only shards of the checkpoint.

    Shards the patterns deliberately left out (`unselected`) are warned about, not failed.
    """
    problems: list[FileProblem] = []
    tensors: dict[str, frozenset[str]] = {}
    for path in sorted(expected):
        if path.endswith(".safetensors"):
            try:
                tensors[path] = read_safetensors_summary(directory / path).tensors
            except (SafetensorsFormatError, OSError) as err:
                problems.append(FileProblem(path, f"not a loadable safetensors file: {err}"))
    known = set(expected)
    for path in sorted(expected):
        if path.endswith(INDEX_SUFFIX):
            found, left_out = check_index(path, (directory / path).read_bytes(), known, tensors, unselected)
            problems.extend(FileProblem(path, text) for text in found)
            warnings.extend(left_out)
    if problems:
        raise CheckpointIntegrityError(
            f"The checkpoint at {commit} matches its source byte for byte but is not loadable; the"
            " repository itself is broken at this revision. Fix: choose another checkpoint_revision:",
            problems,
        )


def _resolve_owner(owner: str | None, group: str | None) -> tuple[int | None, int | None]:
    try:
        uid = pwd.getpwnam(owner).pw_uid if owner else None
    except KeyError:
        raise CheckpointError(
            f"appliance_user {owner!r} does not exist on this host. Fix: let the provision stage create it"
            " (appliance_manage_user: true), or set appliance_user to an existing account."
        ) from None
    try:
        gid = grp.getgrnam(group).gr_gid if group else None
    except KeyError:
        raise CheckpointError(
            f"appliance_group {group!r} does not exist on this host. Fix: appliance_group."
        ) from None
    return uid, gid


def _chown_if_needed(path: Path, uid: int | None, gid: int | None, *, dry_run: bool = False) -> bool:
    st = path.lstat()
    want_uid = st.st_uid if uid is None else uid
    want_gid = st.st_gid if gid is None else gid
    if (st.st_uid, st.st_gid) == (want_uid, want_gid):
        return False
    if not dry_run:
        os.lchown(path, want_uid, want_gid)
    return True


def _apply_ownership(
    directory: Path, expected: dict[str, ExpectedFile], uid: int | None, gid: int | None, *, dry_run: bool
) -> bool:
    if uid is None and gid is None:
        return False
    paths = {directory}
    for name in expected:
        local = directory / name
        paths.add(local)
        parent = local.parent
        while parent != directory:
            paths.add(parent)
            parent = parent.parent
    for extra in (MANIFEST_NAME, PARTIAL_DIR):
        if (directory / extra).exists():
            paths.add(directory / extra)
    changed = False
    for path in sorted(paths):
        if path.exists():
            changed |= _chown_if_needed(path, uid, gid, dry_run=dry_run)
    return changed


def _extra_files(directory: Path, expected: dict[str, ExpectedFile]) -> list[str]:
    extra: list[str] = []
    leftover = temporary_prefix(directory / MANIFEST_NAME)
    for root, dirs, files in os.walk(directory):
        rel_root = os.path.relpath(root, directory)
        if rel_root == ".":
            dirs[:] = [d for d in dirs if d not in BOOKKEEPING]
            files = [f for f in files if f not in BOOKKEEPING]
        for name in files:
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            # A manifest write a crash cut short (the older scheme's temporary names too) is no extra file.
            if rel not in expected and not name.startswith((f"{MANIFEST_NAME}.", leftover)):
                extra.append(rel)
    return sorted(extra)


def _clean_partials(directory: Path, expected: dict[str, ExpectedFile]) -> None:
    """Drop partial files no expected file can use (another revision's); keep the rest for resume."""
    partial_dir = directory / PARTIAL_DIR
    if not partial_dir.is_dir():
        return
    keys = {f"{want.content_key}.part" for want in expected.values()}
    for part in partial_dir.glob("*.part"):
        if part.name not in keys:
            part.unlink(missing_ok=True)


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
