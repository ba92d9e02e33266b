"""Replacing a file in one rename, so that a reader (a play, supervisord, SGLang importing a patched
module, the next run after a crash) sees the old content or the new one and never a torn file.

Every writer of state, records, manifests, patched sources and supervisor sections goes through
`write_atomic`: the temporary file lies in the target's directory (a rename across filesystems
is a copy), it is fsynced before the rename and the directory after it (so a power cut after the
run reports success keeps what it reported), and the mode and owner are set on the temporary
file, so the file never shows at its name with the wrong ones.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["fsync_directory", "temporary_prefix", "write_atomic"]


def temporary_prefix(path: Path) -> str:
    """The prefix of `path`'s temporary files: hidden, and named after the file, so a crash's
    leftover says what it was (the checkpoint's extra-file check passes it over by this)."""
    return f".{path.name}."


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic(
    path: Path,
    data: str | bytes,
    *,
    mode: int = 0o644,
    owner: tuple[int, int] | None = None,
    make_parents: bool = True,
) -> None:
    """Replace `path` with `data` (text is written as UTF-8) in one rename.

    `mode` is the file's permission bits (the callers that used mkstemp's own 0600 say so);
    `owner` is (uid, gid) for os.chown, -1 for one left alone, None for the writer's own. The
    temporary file is removed when anything fails, so a failed write leaves the old file alone."""
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
