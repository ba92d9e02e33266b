"""The SGLang workers' runtime environment: which variables the serving role must set, and checks on them.

The values live in the serving role (defaults/main.yml serving_env_defaults_common and
serving_env_defaults_workers; vars/main.yml __serving_build_cache_dir), each with a comment naming the
library code that reads it; roles/serving/README.md tables them. This module names the variables
once for what checks them: the render tests (every worker carries each one, inside the program
user's home), the serving role (an override that points a cache outside that home must be writable
by the program user) and the release record (where this release's caches live).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

# Directories a worker's libraries write to (each falls back under HOME when unset; see the role's
# comments for the code that reads each). All of them must be writable by the program user.
CACHE_VARIABLES: tuple[str, ...] = (
    "HOME",
    "XDG_CACHE_HOME",
    "SGLANG_CACHE_DIR",
    "SGLANG_JIT_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "FLASHINFER_WORKSPACE_BASE",
    "TILELANG_CACHE_DIR",
    "TVM_FFI_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCH_EXTENSIONS_DIR",
    "CUDA_CACHE_PATH",
    "HF_HOME",
)
# The rest of the contract: fixed values or the toolkit, not caches.
OTHER_VARIABLES: tuple[str, ...] = ("HF_HUB_OFFLINE", "CUDA_HOME", "PATH", "CUDA_DEVICE_ORDER")
CONTRACT_VARIABLES: tuple[str, ...] = CACHE_VARIABLES + OTHER_VARIABLES
# Keyed by the SGLang build (<cache>/sglang/<version>-<build>/): their libraries do not key by version.
PER_BUILD_VARIABLES: tuple[str, ...] = ("SGLANG_CACHE_DIR", "TORCH_EXTENSIONS_DIR")


class RuntimeEnvError(ValueError):
    """A worker's environment breaks the contract; the message names the variable and the fix."""


def _inside(path: str, root: str) -> bool:
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def missing_variables(env: Mapping[str, Any]) -> list[str]:
    """Contract variables a worker's merged environment lacks (an operator set one to null)."""
    return [name for name in CONTRACT_VARIABLES if not str(env.get(name) or "").strip()]


def caches_outside(programs: Mapping[str, Mapping[str, Any]], home: str) -> list[dict[str, str]]:
    """[{program, variable, path}] of the workers' cache variables that point outside `home`.

    `programs` is the serving role's program specs (name -> {role, environment}); the router is not
    a worker. A relative path is refused here: the libraries resolve it against the working directory.
    """
    out = []
    for name, spec in sorted(programs.items()):
        if spec.get("role", name) == "router":
            continue
        env = spec.get("environment") or {}
        lacking = missing_variables(env)
        if lacking:
            raise RuntimeEnvError(
                f"pd:{name} has no {', '.join(lacking)} (an env hook set it to null): the workers' runtime "
                "environment needs each (roles/serving/README.md); remove the null from serving_env_*"
            )
        for variable in CACHE_VARIABLES:
            path = str(env[variable])
            if not posixpath.isabs(path):
                raise RuntimeEnvError(
                    f"pd:{name} {variable}={path!r} is not an absolute path: set it to a directory the "
                    f"program user writes, e.g. under serving_home_dir ({home})"
                )
            if not _inside(path, home):
                out.append({"program": name, "variable": variable, "path": path})
    return out


def release_caches(
    programs: Mapping[str, Mapping[str, Any]], home: str, cache_root: str, build_dir: str
) -> dict[str, Any]:
    """The release record's `caches` part: where this release's workers keep their caches.

    {home, root, sglang_build_dir, env: {variable: path}}; env is the first worker's (the role gives
    every worker the same unless an instance's own env hook differs: then that program's section,
    also in the record, says so). {} on a host without workers.
    """
    workers = [spec for name, spec in sorted(programs.items()) if spec.get("role", name) != "router"]
    if not workers:
        return {}
    env = workers[0].get("environment") or {}
    return {
        "home": home,
        "root": cache_root,
        "sglang_build_dir": build_dir,
        "env": {name: str(env.get(name, "")) for name in CACHE_VARIABLES},
    }
