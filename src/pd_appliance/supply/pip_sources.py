"""pip's configured package sources as uv flags, so that uv installs from exactly what pip would.

Standard library only, and runnable as a script (`python src/pd_appliance/supply/pip_sources.py`
prints the flags): `make venv` uses it before pd_appliance is installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# pip's source settings that uv takes as flags of the same name (uv reads no pip.conf).
PIP_SOURCE_KEYS = ("index-url", "extra-index-url", "find-links")


def pip_sources_as_uv_flags(python: str) -> list[str]:
    """The package sources pip is configured with (pip.conf files and PIP_* variables, as `pip config
    list` shows them), as uv flags: uv then installs from exactly what pip would, mirrors and local
    wheel directories included."""
    result = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    return flags_from_pip_config(result.stdout)


def flags_from_pip_config(listing: str) -> list[str]:
    """uv flags from `pip config list` output (`scope.key='value'` lines; PIP_* variables, scope
    `:env:`, win over the files). A local (file://) index that does not exist is left out: pip only
    warns about it, uv would fail."""
    settings: dict[str, str] = {}
    for line in listing.splitlines():
        scope_key, _, value = line.partition("=")
        scope, _, key = scope_key.rpartition(".")
        if key in PIP_SOURCE_KEYS and (scope == ":env:" or key not in settings):
            settings[key] = value.strip().strip("'\"")
    # pip takes the best match across all its indexes; uv's default stops at the first index that
    # has the name. Same sources, pip's choice (the requirements pin every version exactly).
    flags = ["--index-strategy", "unsafe-best-match"]
    for key in PIP_SOURCE_KEYS:
        for value in settings.get(key, "").split():
            if not value.startswith("file://") or Path(value.removeprefix("file://")).exists():
                flags += [f"--{key}", value]
    return flags


if __name__ == "__main__":
    print(" ".join(pip_sources_as_uv_flags(sys.argv[1] if len(sys.argv) > 1 else sys.executable)))
