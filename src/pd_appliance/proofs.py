"""Proof records: skip a check whose inputs have not changed since it last passed.

Some tasks prove something rather than change something: the lock proof (every locked package
against the index), the NIXL check (bytes moved GPU to GPU), the pd_appliance wheel build. On a
re-run with nothing to do they cost most of the time and prove nothing new. Each such proof names
its inputs; their digest is kept with the result in a small JSON record (on the host under
appliance_state_dir/proofs, or in the controller's build directory for the wheel). A later run
skips the proof when the record's digest equals the digest of today's inputs, and says so; a
changed input, a missing or unreadable record, or `appliance_force_checks` runs it again. Only a
proof that passed is recorded, so a failure is never remembered as proven.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The prefix of the line a skipped proof prints; the pd-appliance run summary collects these lines.
SKIP_PREFIX = "PROOF SKIPPED"
RECORD_VERSION = 1


def digest(inputs: Any) -> str:
    """sha256 of the inputs as canonical JSON: key order and whitespace never change the digest."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def tree_digest(paths: Iterable[str | Path], suffixes: tuple[str, ...] = ()) -> str:
    """sha256 over the files under `paths` (files or directories): relative name and content of each,
    in sorted order, so a renamed, added, removed or edited file changes it. `suffixes` limits which
    files count (e.g. (".py", ".toml")); bytecode caches never count."""
    h = hashlib.sha256()
    for top in map(Path, paths):
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or (suffixes and not path.name.endswith(suffixes)):
                continue
            name = path.name if path == top else str(path.relative_to(top))
            h.update(f"{top.name}/{name}\0".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class ProofRecord:
    """What was proven, by which inputs (their digest), when, and what it found."""

    name: str
    digest: str
    proven_at: str
    result: Any = None
    version: int = RECORD_VERSION

    def to_json(self) -> str:
        fields = {
            "name": self.name, "digest": self.digest, "proven_at": self.proven_at, "version": self.version,
        }  # fmt: skip
        return json.dumps({**fields, "result": self.result}, sort_keys=True, indent=1, default=str) + "\n"


def new_record(
    name: str, input_digest: str, result: Any = None, now: dt.datetime | None = None
) -> ProofRecord:
    """A record of a proof that passed just now (UTC, to the second)."""
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    # Plain JSON values: what Ansible hands a filter may be its own (lazy) container types.
    plain = json.loads(json.dumps(result, default=str))
    return ProofRecord(name=name, digest=input_digest, proven_at=stamp, result=plain)


def parse_record(text: str | None) -> ProofRecord | None:
    """The record in `text`, or None when it is missing, unreadable or of another format: the proof
    then runs, which is always safe."""
    if not text:
        return None
    try:
        data = json.loads(text)
        if data.get("version") != RECORD_VERSION:
            return None
        return ProofRecord(
            name=str(data["name"]),
            digest=str(data["digest"]),
            proven_at=str(data["proven_at"]),
            result=data.get("result"),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def read_record_slurped(path: Path) -> dict[str, Any]:
    """A record file shaped like ansible.builtin.slurp's result ({} when absent), for pd_proof_decide.

    What a module that reads a venv's state returns beside it, so the record costs no slurp of its own.
    """
    if not path.is_file():
        return {}
    return {"content": base64.b64encode(path.read_bytes()).decode("ascii"), "source": str(path)}


def decide(name: str, record_text: str | None, input_digest: str, force: bool = False) -> dict[str, Any]:
    """Whether proof `name` must run: {run, reason, line, result}. `line` is what a skip prints
    (what, why, how to force it); `result` is the recorded result a skip reuses."""
    record = parse_record(record_text)
    if force:
        return {"run": True, "reason": "forced (appliance_force_checks)", "line": "", "result": None}
    if record is None:
        return {"run": True, "reason": "no proof recorded", "line": "", "result": None}
    if record.name != name or record.digest != input_digest:
        return {"run": True, "reason": "inputs changed since " + record.proven_at, "line": "", "result": None}
    line = (
        f"{SKIP_PREFIX}: {name}: inputs unchanged since {record.proven_at} (digest {input_digest[:12]}); "
        "force with --force-checks (appliance_force_checks=true)"
    )
    return {"run": False, "reason": "inputs unchanged", "line": line, "result": record.result}
