"""Env hook names checked against SGLang's environment registry, as derived from the pinned wheel.

SGLang reads a misspelt `SGLANG_*` variable the way it reads any unknown one: not at all, and
silently. The registry file (files/sglang/<version>/environ-names.json, written by
`python -m pd_appliance.sglang_args environ-names`) lists the names the patched wheel reads:
the fields of `sglang.srt.environ.Envs`, the names its code reads straight from os.environ, and
the names the appliance's patch series adds. This module needs only the standard library, so
preflight runs it on the controller before anything is installed anywhere.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Prefixes SGLang owns. SGL_ is its legacy spelling, renamed to SGLANG_ when it starts
# (sglang/srt/environ.py, _handle_deprecated_envs).
SGLANG_PREFIX = "SGLANG_"
LEGACY_PREFIX = "SGL_"
REGISTRY_FORMAT = 1


class RegistryError(ValueError):
    """The registry file is missing or not one this module wrote."""


@dataclass(frozen=True)
class EnvRegistry:
    """The env names one SGLang version reads, and the deprecated ones with SGLang's advice."""

    sglang_version: str
    names: frozenset[str]
    deprecated: Mapping[str, str] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> EnvRegistry:
        if data.get("format") != REGISTRY_FORMAT or "names" not in data:
            raise RegistryError(f"{source or 'registry'}: not an environ-names file of format 1")
        names = set(data["names"]) | set(data.get("read_directly", [])) | set(data.get("patch_series", []))
        return cls(
            sglang_version=str(data.get("sglang_version", "?")),
            names=frozenset(names),
            deprecated=dict(data.get("deprecated", {})),
            source=source,
        )

    @classmethod
    def load(cls, path: str | Path) -> EnvRegistry:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise RegistryError(
                f"{path} does not exist: generate it from the pinned wheel with "
                "`python -m pd_appliance.sglang_args environ-names --wheel <sglang wheel> --output "
                f"{path}`"
            ) from exc
        except json.JSONDecodeError as exc:
            raise RegistryError(f"{path}: not JSON ({exc})") from exc
        return cls.from_dict(data, str(path))

    def suggestions(self, name: str, limit: int = 3) -> list[str]:
        """Known names closest to `name`. Matched without the shared SGLANG_ prefix, which would
        otherwise make every candidate look 7 characters alike."""
        stem = name.removeprefix(SGLANG_PREFIX).removeprefix(LEGACY_PREFIX)
        stems = {n.removeprefix(SGLANG_PREFIX): n for n in self.names if n.startswith(SGLANG_PREFIX)}
        close = difflib.get_close_matches(stem, list(stems), n=limit, cutoff=0.75)
        return [stems[s] for s in close]

    def problem(self, name: str) -> tuple[str, str] | None:
        """(why SGLang would not honour `name` as written, the fix), or None when it reads it."""
        ver = self.sglang_version
        if name.startswith(LEGACY_PREFIX):
            modern = SGLANG_PREFIX + name.removeprefix(LEGACY_PREFIX)
            if modern in self.names:
                return f"SGL_ is SGLang's legacy prefix, SGLang {ver} reads it as {modern}", f"write {modern}"
            name = modern
        elif not name.startswith(SGLANG_PREFIX):
            return None
        if name in self.deprecated:
            return f"SGLang {ver} deprecates it ({self.deprecated[name].rstrip('.')})", "rename or remove it"
        if name in self.names:
            return None
        hint = self.suggestions(name)
        fix = f"did you mean {' or '.join(hint)}?" if hint else f"see sglang/srt/environ.py of SGLang {ver}"
        return f"SGLang {ver} does not read it (not in {self.source or 'its registry'})", fix


def env_name_errors(host: str, sources: Mapping[str, Iterable[str]], registry: EnvRegistry) -> list[str]:
    """One message per SGLang env name, in any source, that SGLang would not honour as written.

    `sources` maps where the names come from (the inventory variable, e.g. serving_env_decode or
    validation_variants[fast].env_hooks.decode) to the names it sets.
    """
    errors = []
    for variable, names in sources.items():
        for name in names:
            found = registry.problem(str(name))
            if found:
                why, fix = found
                errors.append(f"{host}: {variable} sets {name}: {why}. Fix the name in {variable}: {fix}")
    return errors


def variant_sources(variants: Iterable[Mapping[str, Any]] | None) -> dict[str, list[str]]:
    """validation_variants[*].env_hooks as sources: label -> names (env_hooks is keyed by program)."""
    out: dict[str, list[str]] = {}
    for index, variant in enumerate(variants or []):
        if not isinstance(variant, Mapping):
            continue
        label = variant.get("name", index)
        hooks = variant.get("env_hooks") or {}
        if not isinstance(hooks, Mapping):
            continue
        for scope, env in hooks.items():
            if isinstance(env, Mapping):
                out[f"validation_variants[{label}].env_hooks.{scope}"] = [str(k) for k in env]
    return out
