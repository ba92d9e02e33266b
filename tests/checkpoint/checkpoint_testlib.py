"""Damage for the checkpoint tests: bytes changed in place, the mtime given back (or moved on)."""

from __future__ import annotations

import os
from pathlib import Path


def overwrite_in_place(path: Path, offset: int, data: bytes | None = None, later_ns: int = 0) -> None:
    """Write `data` at `offset` (None: flip the lowest bit of the byte there), then give `path` back
    its mtime plus `later_ns`: with 0, damage that a stat check cannot see, only a hash."""
    stat = path.stat()
    with path.open("r+b") as handle:
        if data is None:
            handle.seek(offset)
            data = bytes([handle.read(1)[0] ^ 0x01])
        handle.seek(offset)
        handle.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + later_ns))
