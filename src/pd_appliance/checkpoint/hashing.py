"""Parallel file hashing that keeps the disk, not one CPU core, the bottleneck.

Several files are hashed at once (one thread each): hashlib releases the GIL while it digests
a large buffer, so threads overlap both reads and SHA-256 work across cores, and each file is
read in large sequential chunks into a reused buffer (no per-chunk allocation) with the
kernel told to read ahead. SHA-256 of one file is inherently sequential, so the speed-up comes
from hashing several shards side by side, which a 149 GB checkpoint of ~4 GB shards allows.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# 16 MiB reads: large enough that syscall and Python overhead vanish next to the hash work.
DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024
ProgressCallback = Callable[[int], None]


def default_workers() -> int:
    """Files hashed side by side: one per core, at most 8 (more only adds seek contention)."""
    return max(1, min(8, os.cpu_count() or 1))


@dataclass(frozen=True)
class FileDigest:
    """A file's identity as read: size, sha256, optionally its git blob id, and the stat it was read at."""

    size: int
    sha256: str
    git_sha1: str | None
    mtime_ns: int
    inode: int


def hash_file(
    path: Path,
    *,
    git_sha1: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: ProgressCallback | None = None,
) -> FileDigest:
    """Hash one file sequentially; `git_sha1` adds git's blob id (sha1 of "blob <size>\\0" + content)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        before = os.fstat(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        sha256 = hashlib.sha256()
        sha1 = hashlib.sha1(f"blob {before.st_size}\0".encode()) if git_sha1 else None
        buffer = bytearray(chunk_bytes)
        view = memoryview(buffer)
        size = 0
        with os.fdopen(os.dup(fd), "rb", buffering=0) as handle:
            while count := handle.readinto(buffer):
                chunk = view[:count]
                sha256.update(chunk)
                if sha1 is not None:
                    sha1.update(chunk)
                size += count
                if progress is not None:
                    progress(count)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if after.st_size != size or after.st_mtime_ns != before.st_mtime_ns:
        raise OSError(f"{path} changed while it was being hashed; re-run when nothing writes to it")
    return FileDigest(
        size=size,
        sha256=sha256.hexdigest(),
        git_sha1=sha1.hexdigest() if sha1 is not None else None,
        mtime_ns=after.st_mtime_ns,
        inode=after.st_ino,
    )


@dataclass(frozen=True)
class HashJob:
    """One file to hash: its key (usually the repository path) and where it is on disk."""

    key: str
    path: Path
    git_sha1: bool = False


def hash_files(
    jobs: Iterable[HashJob],
    *,
    workers: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: ProgressCallback | None = None,
) -> dict[str, FileDigest | OSError]:
    """Hash many files, `workers` at a time, largest first so the last file does not finish alone.

    A file that cannot be read maps to its OSError instead of aborting the others.
    """
    ordered = sorted(jobs, key=lambda job: _size_or_zero(job.path), reverse=True)

    def run(job: HashJob) -> tuple[str, FileDigest | OSError]:
        try:
            return job.key, hash_file(
                job.path, git_sha1=job.git_sha1, chunk_bytes=chunk_bytes, progress=progress
            )
        except OSError as err:
            return job.key, err

    with ThreadPoolExecutor(max_workers=workers or default_workers(), thread_name_prefix="pd-hash") as pool:
        return dict(pool.map(run, ordered))


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
