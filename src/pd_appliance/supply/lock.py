"""Hashed locks as ``uv pip compile --generate-hashes`` writes them, and checks on them.

A lock is a requirements file in which every package is pinned (``name==version``) and carries one
``--hash=sha256:...`` per distribution file the index offers for that version. uv annotates each
entry with the packages that pulled it in (``# via``), which gives the dependency graph the roles
need to install a part of the lock (NIXL alone, or the set that works without the CUDA stack).
The locks are installed with ``--no-deps``: the lock *is* the resolution, and hash-checking mode
then rejects any file whose digest the lock does not name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

_ENTRY = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+?)(?:\s*;\s*(?P<marker>[^\\]+?))?\s*\\?$"
)
_HASH = re.compile(r"--hash=sha256:(?P<digest>[0-9a-f]{64})")
_ROOT_VIA = "-r "


class LockError(ValueError):
    """A lock that cannot be used as it is (malformed, or missing what a caller asked for)."""


@dataclass
class LockEntry:
    """One pinned package of a lock."""

    name: str  # canonical (PEP 503) name
    version: str
    hashes: list[str] = field(default_factory=list)
    marker: str = ""
    via: list[str] = field(default_factory=list)  # canonical names of dependents; "-r file" for roots

    def line(self) -> str:
        """The entry as a hash-checking requirements line (what pip and uv read back)."""
        marker = f" ; {self.marker}" if self.marker else ""
        hashes = "".join(f" \\\n    --hash=sha256:{h}" for h in self.hashes)
        return f"{self.name}=={self.version}{marker}{hashes}\n"


def parse_lock(text: str, source: str = "lock") -> dict[str, LockEntry]:
    """Entries by canonical name. Fails on anything that is not pinned and hashed: a lock that
    lets the index choose a version or a file is no lock."""
    entries: dict[str, LockEntry] = {}
    current: LockEntry | None = None
    in_via = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if not raw[0].isspace() and not line.startswith("#"):
            match = _ENTRY.match(line)
            if not match:
                raise LockError(f"{source}:{number}: not a pinned requirement: {line!r}")
            name = canonicalize_name(match["name"])
            if name in entries:
                raise LockError(f"{source}:{number}: {name} is pinned twice")
            marker = (match["marker"] or "").strip()
            current = entries[name] = LockEntry(name, match["version"], marker=marker)
            in_via = False
            continue
        if current is None:
            continue  # the header comment
        hashed = _HASH.search(line)
        if hashed:
            current.hashes.append(hashed["digest"])
        elif line.startswith("# via"):
            rest = line.removeprefix("# via").strip()
            in_via = not rest
            if rest:
                current.via.append(_via_name(rest))
        elif in_via and line.startswith("#"):
            current.via.append(_via_name(line.lstrip("#").strip()))
    for entry in entries.values():
        if not entry.hashes:
            raise LockError(
                f"{source}: {entry.name}=={entry.version} has no --hash: regenerate with --generate-hashes"
            )
    return entries


def _via_name(text: str) -> str:
    return text if text.startswith(_ROOT_VIA) else str(canonicalize_name(text.split()[0]))


def read_lock(path: Path) -> dict[str, LockEntry]:
    """parse_lock on a file, naming the file in errors."""
    return parse_lock(path.read_text(), str(path))


def dependencies(entries: Mapping[str, LockEntry]) -> dict[str, set[str]]:
    """Forward edges (package -> what it requires) from uv's reverse ``# via`` annotations."""
    graph: dict[str, set[str]] = {name: set() for name in entries}
    for name, entry in entries.items():
        for parent in entry.via:
            if parent in graph:
                graph[parent].add(name)
    return graph


def closure(entries: Mapping[str, LockEntry], roots: Iterable[str], stop: Iterable[str] = ()) -> list[str]:
    """The roots and everything they pull in, not descending into ``stop`` (nor listing it)."""
    graph = dependencies(entries)
    stopped = {canonicalize_name(s) for s in stop}
    wanted = [canonicalize_name(r) for r in roots]
    missing = [r for r in wanted if r not in entries]
    if missing:
        raise LockError(f"not in the lock: {', '.join(missing)}")
    seen: set[str] = set()
    todo: list[str] = [r for r in wanted if r not in stopped]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(child for child in graph[name] if child not in stopped and child not in seen)
    return sorted(seen)


def unsatisfied(
    entries: Mapping[str, LockEntry], names: Iterable[str], installed: Mapping[str, str]
) -> list[str]:
    """The named entries a venv does not hold at the locked version (``installed``: name -> version, as
    importlib.metadata lists a venv's distributions): what an installer run would change. pip and uv
    skip a requirement already satisfied without hashing it again, so an empty list means that run
    would be a no-op."""
    held = {canonicalize_name(name): version for name, version in installed.items()}
    chosen = sorted({canonicalize_name(n) for n in names})
    missing = [n for n in chosen if n not in entries]
    if missing:
        raise LockError(f"not in the lock: {', '.join(missing)}")
    return [n for n in chosen if held.get(n) != entries[n].version]


def render(entries: Mapping[str, LockEntry], names: Iterable[str] | None = None, header: str = "") -> str:
    """A hash-checking requirements file with the named entries (all when ``names`` is None)."""
    chosen = sorted(entries) if names is None else sorted({canonicalize_name(n) for n in names})
    missing = [n for n in chosen if n not in entries]
    if missing:
        raise LockError(f"not in the lock: {', '.join(missing)}")
    lines = [f"# {ln}\n" for ln in header.splitlines()]
    return "".join(lines) + "".join(entries[n].line() for n in chosen)
