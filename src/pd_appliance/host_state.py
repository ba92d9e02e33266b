"""The host's state in one Ansible local fact: `<appliance_root>/etc/ansible/facts.d/pd_appliance.fact`.

What a host runs used to be scattered over files each play read back on its own (the release
state, the adopted-variant record, the checkpoint's refs/) and facts each play derived again.
The fact gathers the pointers in one JSON object that fact gathering (`setup` with `fact_path`)
returns as `ansible_local.pd_appliance`, as DebOps keeps its host state:

    release      the release in force and the newest accepted one (pd_appliance.release)
    variant      the tuning variant the tuner adopted here (pd_appliance.bench.variants)
    checkpoint   the commit each branch or tag of checkpoint_revision resolved to here
    fleet        whether the router sends this host requests: {"rotation": "out"} after
                 playbooks/day2/drain.yml took it out (pd_appliance.serving.discovery), "in" again after
                 `-e state=in`; absent means in rotation

The records behind the pointers (release records and history, the adopted variant's report)
stay where their owners keep them. One module writes the fact (pd_host_state): each writer
passes only its own top-level keys and the others are kept, and the file is replaced by a
rename, so a reader never sees a torn file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_appliance.files import write_atomic

# Under appliance_root: on a lab (appliance_root "") the directory `setup` reads by default.
FACTS_DIR = "etc/ansible/facts.d"
FACT_NAME = "pd_appliance"
# The keys the appliance writes; a writer passing another one is a bug in the role, refused.
KEYS = ("release", "variant", "checkpoint", "fleet")


class HostStateError(Exception):
    """The fact file cannot be read as JSON, or a writer passed an unknown key."""


@dataclass(frozen=True)
class Update:
    """What an update found and made: the state before and after, and whether the file changes."""

    before: dict[str, Any]
    after: dict[str, Any]

    @property
    def changed(self) -> bool:
        return self.before != self.after


def fact_path(facts_dir: Path) -> Path:
    """The fact file in `facts_dir` (its name is what ansible_local calls it)."""
    return facts_dir / f"{FACT_NAME}.fact"


def read(path: Path) -> dict[str, Any]:
    """The state in `path`; {} when there is none yet. A damaged file is an error naming the fix:
    `setup` would turn it into a warning string and every play would read nothing."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise HostStateError(f"{path} is unreadable ({exc})") from exc
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise HostStateError(
            f"{path} is not JSON ({exc}): remove it; the next serve and validate runs write it again"
        ) from exc
    if not isinstance(data, dict):
        raise HostStateError(f"{path} holds a {type(data).__name__}, not a JSON object: remove it")
    return data


def merged(before: Mapping[str, Any], values: Mapping[str, Any], remove: list[str]) -> dict[str, Any]:
    """`before` with each key of `values` replaced and each key of `remove` dropped; the rest kept."""
    unknown = sorted((set(values) | set(remove)) - set(KEYS))
    if unknown:
        raise HostStateError(f"unknown host state keys {unknown}: the fact holds {list(KEYS)}")
    after = {k: v for k, v in before.items() if k not in remove}
    after.update(values)
    return after


def update(
    path: Path, values: Mapping[str, Any], remove: list[str] | None = None, *, dry_run: bool = False
) -> Update:
    """Set the keys in `values` (and drop those in `remove`) in the fact at `path`, keeping the others.

    Written only when something changes (a re-run leaves the file and its mtime alone), through a
    temporary file in the same directory renamed over it, mode 0644 (fact gathering may run
    unprivileged). `dry_run` (check mode) computes the result and writes nothing."""
    before = read(path)
    # Through JSON, so what is compared is what a reader gets back (tuples become lists).
    after = json.loads(json.dumps(merged(before, values, remove or [])))
    result = Update(before=before, after=after)
    if result.changed and not dry_run:
        write(path, after)
    return result


def write(path: Path, data: Mapping[str, Any]) -> None:
    """Replace `path` with `data` as JSON in one rename."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o644)


def describe(state: Mapping[str, Any]) -> str:
    """One line of what the host state says, for `pd-appliance status`'s summary."""
    release = state.get("release") or {}
    variant = state.get("variant") or {}
    checkpoint = state.get("checkpoint") or {}
    parts = []
    if release.get("current"):
        parts.append(
            f"release {release['current']} [{release.get('status') or '?'}]"
            f"; newest accepted {release.get('accepted') or 'none'}"
        )
    else:
        parts.append("no release recorded")
    parts.append(
        f"variant {variant.get('name')}"
        + (f" (adopted {variant['adopted_at']})" if variant.get("adopted_at") else "")
        if variant
        else "no adopted variant"
    )
    if checkpoint.get("commit"):
        revision = checkpoint.get("revision") or checkpoint["commit"]
        parts.append(
            f"checkpoint {revision}"
            + (f" = {checkpoint['commit']}" if revision != checkpoint["commit"] else "")
        )
    else:
        parts.append("no checkpoint recorded")
    if (state.get("fleet") or {}).get("rotation") == "out":
        parts.append("OUT OF ROTATION (playbooks/day2/drain.yml -e state=in puts it back)")
    return "; ".join(parts)
