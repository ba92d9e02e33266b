"""One directory per checkpoint revision: `<root>/<commit>/`, branches recorded in `<root>/refs/<name>`.

A new revision is downloaded beside the one serving, so the servers keep reading the old one until
the new one is verified and a release on it is started; the old one is removed only once that
release is accepted (pd_appliance.release.store prunes it). Files a new revision shares with a
verified earlier one (the same LFS sha256 and size: usually every shard when only a config changes)
are hard-linked from it and hashed again, instead of fetched; a checkpoint from before revision
directories (files directly in `<root>`, with its manifest) serves as such a source too.

`<root>/refs/<name>` holds the commit a branch or tag resolved to when it was last verified here, so a
stage that runs alone (serve, validate) finds the directory of `checkpoint_revision: main`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pd_appliance.checkpoint.errors import CheckpointError
from pd_appliance.checkpoint.manifest import MANIFEST_NAME, Manifest, ManifestError, load_manifest
from pd_appliance.files import write_atomic

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
REFS = "refs"


def ref_path(root: Path, name: str) -> Path:
    """Where the commit of branch/tag `name` is recorded (names may hold slashes: refs/pr/1)."""
    parts = [p for p in name.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise CheckpointError(f"checkpoint_revision {name!r} is not a usable branch or tag name")
    return root.joinpath(REFS, *parts)


def read_ref(root: Path, name: str) -> str | None:
    """The commit recorded for `name`, or None."""
    try:
        commit = ref_path(root, name).read_text().strip()
    except (OSError, CheckpointError):
        return None
    return commit if COMMIT_RE.match(commit) else None


def write_ref(root: Path, name: str, commit: str, uid: int | None = None, gid: int | None = None) -> bool:
    """Record that `name` resolved to `commit`; True when the record changed."""
    if COMMIT_RE.match(name) or read_ref(root, name) == commit:
        return False
    path = ref_path(root, name)
    owner = None if uid is None and gid is None else (-1 if uid is None else uid, -1 if gid is None else gid)
    write_atomic(path, commit + "\n", mode=0o644, owner=owner)
    return True


def verified_revisions(root: Path) -> dict[Path, Manifest]:
    """Every directory under `root` with a readable manifest: the revision directories, and `root`
    itself when it holds a checkpoint from before revision directories."""
    out: dict[Path, Manifest] = {}
    if not root.is_dir():
        return out
    candidates = [root, *sorted(p for p in root.iterdir() if p.is_dir() and COMMIT_RE.match(p.name))]
    for directory in candidates:
        try:
            manifest = load_manifest(directory)
        except ManifestError:
            continue
        if manifest is not None:
            out[directory] = manifest
    return out


def resolve_offline(root: Path, revision: str) -> str:
    """The commit of `revision` without a Hub: itself, its ref, or the one pre-seeded directory holding it."""
    if COMMIT_RE.match(revision):
        return revision
    commit = read_ref(root, revision)
    if commit:
        return commit
    matches = {
        m.revision
        for d, m in verified_revisions(root).items()
        if revision == m.revision_requested or (len(revision) >= 7 and m.revision.startswith(revision))
    }
    if len(matches) == 1:
        return matches.pop()
    seeded = ", ".join(sorted(p.name for p in verified_revisions(root))) or "none"
    raise CheckpointError(
        f"checkpoint_offline is true and checkpoint_revision {revision!r} names "
        f"{'several' if matches else 'no'} revision(s) pre-seeded under {root} (verified: {seeded})."
        f" Fix: set checkpoint_revision to the 40-hex commit, and seed {root}/<commit>/ with a verified copy"
        f" including its {MANIFEST_NAME}."
    )


def reuse_sources(root: Path, target: Path) -> dict[str, list[tuple[Path, str]]]:
    """sha256 -> [(file, its manifest path)] of every verified file under `root` outside `target`, whose
    stat still matches its manifest (so its bytes are the ones verified)."""
    out: dict[str, list[tuple[Path, str]]] = {}
    for directory, manifest in verified_revisions(root).items():
        if directory == target:
            continue
        for rel, entry in manifest.files.items():
            if not entry.lfs:
                continue  # small git files are cheaper to fetch than to prove
            local = directory / rel
            try:
                st = local.stat()
            except OSError:
                continue
            if (st.st_size, st.st_mtime_ns, st.st_ino) == (entry.size, entry.mtime_ns, entry.inode):
                out.setdefault(entry.sha256, []).append((local, rel))
    return out


def link_from(source: Path, destination: Path) -> bool:
    """Hard-link `source` to `destination` (same filesystem only); True when linked."""
    destination.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except FileExistsError:
        return False
    except OSError:  # another filesystem, or links not allowed: the file is fetched instead
        return False
    return True
