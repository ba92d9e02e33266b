"""History of accepted runs on the host: what a regression check compares against."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pd_appliance.files import write_atomic


class HistoryError(ValueError):
    """The history file cannot be read; the message names the file and the line."""


def load(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    file = Path(path)
    if not file.exists():
        return []
    entries: list[dict[str, Any]] = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(
                f"{file}:{number} is not JSON ({exc.msg}); fix or remove that line "
                "(each line is one accepted run)"
            ) from exc
        if not isinstance(entry, dict) or "figures" not in entry:
            raise HistoryError(f"{file}:{number} has no 'figures': not a pd-bench history entry")
        entries.append(entry)
    return entries


def last_accepted(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    entries = load(path)
    return entries[-1] if entries else None


def append(path: str | os.PathLike[str], entry: Mapping[str, Any]) -> None:
    """Append `entry` atomically: a crash mid-write leaves the previous history intact."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    previous = file.read_text(encoding="utf-8") if file.exists() else ""
    if previous and not previous.endswith("\n"):
        previous += "\n"
    write_atomic(file, previous + json.dumps(dict(entry), sort_keys=True) + "\n", mode=0o600)
