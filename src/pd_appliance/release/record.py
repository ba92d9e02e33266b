"""The release record: its parts, its id, what changed between two, and which programs must restart.

A release is recorded per host (each host runs its own programs) from:

- `sglang`: version, build (the venv's name: version + digest of the patch series and locks), venv
  path, the series as applied, and the versions found in the venv (NIXL among them);
- `checkpoint`: repository, commit, manifest digest and the revision's directory;
- `variant`: the tuning variant in force (name and a digest of its overrides; {} when none);
- `programs`: every pd program of the host with the exact supervisor section it runs from (the
  rendered flags and env hooks; secrets are in env files, never in a section) and its health URL.
- `caches`: where the workers keep their caches (the serving role's runtime environment): the
  program user's home, the cache root, the directory of this SGLang build's own caches (a build's
  SGLang and torch-extension caches, which do not key by version; pruned with the build's venv) and
  each cache variable's path. {} on a host without workers.

The id is a digest of all of it except the section comments (notes that change nothing). Two
renders of the same inventory on the same installs give the same id, so a re-run is no new release.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pd_appliance.release.errors import ReleaseError

ID_PREFIX = "r-"
ID_LENGTH = 12
# Parts whose change means new code or new weights under the workers: then every worker of the
# release restarts together (prefill and decode never run different SGLang builds or revisions).
CODE_AND_WEIGHTS = ("sglang", "checkpoint")
ROUTER = "router"


def section_digest(section: str) -> str:
    """sha256 of a supervisor section without its comment lines: what supervisor acts on."""
    lines = [
        ln.rstrip() for ln in section.splitlines() if ln.strip() and not ln.lstrip().startswith((";", "#"))
    ]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def variant_part(variant: dict[str, Any] | None) -> dict[str, Any]:
    """The tuning variant in force as a release part: its name and a digest of its overrides."""
    if not variant or not any(variant.get(k) for k in ("name", "vars", "env_hooks")):
        return {}
    body = {k: variant.get(k) for k in ("vars", "env_hooks") if variant.get(k)}
    return {
        "name": str(variant.get("name") or "unnamed"),
        "source": str(variant.get("source") or ""),
        "digest": hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:12],
    }


CACHE_KEYS = ("home", "root", "sglang_build_dir")


def caches_part(caches: dict[str, Any] | None) -> dict[str, Any]:
    """The `caches` part from the serving role's record of them ({} when the host runs no worker).

    The SGLang build's directory must be named like the build (the venv's name) and lie under the
    cache root, since pruning the build removes it."""
    if not caches:
        return {}
    missing = [k for k in CACHE_KEYS if not str(caches.get(k) or "").startswith("/")]
    if missing:
        raise ReleaseError(
            f"the release's caches need absolute {', '.join(missing)} (got {caches!r}):"
            " the serving role passes them from serving_home_dir and serving_cache_dir"
        )
    build = str(caches["sglang_build_dir"]).rstrip("/")
    root = str(caches["root"]).rstrip("/")
    if not build.startswith(root + "/"):
        raise ReleaseError(f"the SGLang build's cache dir {build} is not under the cache root {root}")
    env = {str(k): str(v) for k, v in sorted((caches.get("env") or {}).items())}
    return {"home": str(caches["home"]), "root": root, "sglang_build_dir": build, "env": env}


@dataclass
class Release:
    """One host's release; `parts` is what the id covers, the rest is bookkeeping."""

    parts: dict[str, Any]
    id: str = ""
    label: str = ""
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = release_id(self.parts)
        if not self.label:
            self.label = release_label(self.parts)

    @property
    def programs(self) -> dict[str, dict[str, Any]]:
        return self.parts.get("programs") or {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": self.label,
            "created": self.created,
            "parts": self.parts,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Release:
        extra = {k: v for k, v in data.items() if k not in ("id", "label", "created", "parts")}
        return cls(
            parts=data["parts"],
            id=data["id"],
            label=data.get("label", ""),
            created=data.get("created", ""),
            extra=extra,
        )


def release_id(parts: dict[str, Any]) -> str:
    """`r-` + 12 hex of the parts, program sections taken without their comments."""
    body = dict(parts)
    body["programs"] = {
        name: {"digest": section_digest(p.get("section", "")), "role": p.get("role")}
        for name, p in sorted((parts.get("programs") or {}).items())
    }
    body["group"] = section_digest(parts.get("group", ""))
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    return ID_PREFIX + digest[:ID_LENGTH]


def release_label(parts: dict[str, Any]) -> str:
    """One line a person reads: sglang (build, patches) + nixl, repo@commit, variant, config digest."""
    sg = parts.get("sglang") or {}
    ck = parts.get("checkpoint") or {}
    sglang = f"sglang {sg.get('version', '?')} ({sg.get('build', '?')}"
    sglang += (
        f", {len(sg.get('series') or [])} patch(es))" if sg.get("installed", True) else ", NOT INSTALLED)"
    )
    nixl = f"nixl {sg.get('nixl') or '?'}"
    revision = str(ck.get("revision") or "?")[:12]
    checkpoint = f"{ck.get('repo_id', '?')}@{revision}" + (
        "" if ck.get("installed", True) else " (NOT VERIFIED)"
    )
    variant = (parts.get("variant") or {}).get("name")
    config = hashlib.sha256(
        json.dumps(
            {
                n: section_digest(p.get("section", ""))
                for n, p in sorted((parts.get("programs") or {}).items())
            }
        ).encode()
    ).hexdigest()[:8]
    out = f"{sglang} + {nixl}, {checkpoint}"
    if variant:
        out += f", variant {variant}"
    return f"{out}, config {config}"


@dataclass
class Change:
    """What differs between the running release and a new one."""

    parts: list[str]
    programs: list[str]
    switch: bool

    def to_dict(self) -> dict[str, Any]:
        return {"parts": self.parts, "programs": self.programs, "switch": self.switch}


def compare(old: Release | None, new: Release) -> Change:
    """Parts that changed, programs whose section changed (added or removed too), and whether the workers
    switch code or weights (then they restart together, see rollout)."""
    if old is None:
        return Change(
            parts=sorted(k for k in new.parts if k != "group"), programs=sorted(new.programs), switch=False
        )
    changed_parts = sorted(
        key
        for key in set(old.parts) | set(new.parts)
        if key not in ("programs", "group")
        and _identity(key, old.parts.get(key)) != _identity(key, new.parts.get(key))
    )
    programs = sorted(
        name
        for name in set(old.programs) | set(new.programs)
        if section_digest((old.programs.get(name) or {}).get("section", ""))
        != section_digest((new.programs.get(name) or {}).get("section", ""))
    )
    if programs:
        changed_parts.append("programs")
    switch = any(part in changed_parts for part in CODE_AND_WEIGHTS)
    return Change(parts=sorted(changed_parts), programs=programs, switch=switch)


def _identity(key: str, part: Any) -> Any:
    """What identifies a part: for the venv its build and series, for a revision its commit and digest."""
    part = part or {}
    if key == "sglang":
        return (part.get("version"), part.get("build"), json.dumps(part.get("series"), sort_keys=True))
    if key == "checkpoint":
        return (part.get("revision"), part.get("manifest_digest"), part.get("dir"))
    return json.dumps(part, sort_keys=True, default=str)
