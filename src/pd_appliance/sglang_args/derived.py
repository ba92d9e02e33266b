"""The two files derived from the real wheel and kept in the repository, and how they are written.

- files/sglang/<version>/environ-names.json: the env names SGLang reads (preflight's registry).
- standins/src/pd_standins/engine/sglang_flags.json: SGLang's flags as data (the rehearsal
  engine's parser is built from it).

Both are descriptions (names, arities, choices), never SGLang source. Each starts with the
command that regenerates it; CI regenerates both from the wheel and fails on any difference.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pd_appliance.patches.series import load_series
from pd_appliance.sglang_args.real import RealSGLang

DOCUMENT_FORMAT = 1
# Where the two files live in the checkout (relative paths; the regenerate commands name them).
ENVIRON_NAMES_PATH = "files/sglang/{version}/environ-names.json"
FLAG_TABLE_PATH = "standins/src/pd_standins/engine/sglang_flags.json"
SERIES_PATH = "files/patches/sglang/{version}"
_ADDED_NAME = re.compile(r"\bSGLANG_[A-Z0-9_]+\b")


def patch_series_names(series_dir: Path) -> set[str]:
    """SGLANG_* names on the added lines of the patch series: the names our patches read."""
    patches, _ = load_series(series_dir)
    names: set[str] = set()
    for _, data in patches:
        for line in data.decode("utf-8").splitlines():
            if line.startswith("+") and not line.startswith("+++"):
                names.update(_ADDED_NAME.findall(line))
    return names


def environ_names_document(
    real: RealSGLang, checkout: Path, series_dir: Path | None = None
) -> dict[str, Any]:
    """The env registry of `real`'s SGLang plus the names the patch series (default: the
    checkout's series for that version) adds."""
    registry = real.environ_names()
    version = registry["sglang_version"]
    series_dir = series_dir or checkout / SERIES_PATH.format(version=version)
    known = set(registry["names"]) | set(registry["read_directly"])
    output = ENVIRON_NAMES_PATH.format(version=version)
    return {
        "//": "SGLang's env registry, derived from the pinned wheel with the patch series applied "
        f"(names only); regenerate with: python -m pd_appliance.sglang_args environ-names --output {output}",
        "format": DOCUMENT_FORMAT,
        "sglang_version": registry["sglang_version"],
        "names": registry["names"],
        "read_directly": registry["read_directly"],
        "patch_series": sorted(patch_series_names(series_dir) - known),
        "deprecated": registry["deprecated"],
    }


def flag_table_document(real: RealSGLang) -> dict[str, Any]:
    table = real.flag_table()
    return {
        "//": "SGLang's command-line flags as data, derived from its real parser; regenerate with: "
        f"python -m pd_appliance.sglang_args flags --output {FLAG_TABLE_PATH}",
        "format": DOCUMENT_FORMAT,
        **table,
    }


def dumps(document: dict[str, Any]) -> str:
    """JSON with one list item a line, so a regenerated file diffs by name or flag."""
    lines = ["{"]
    items = list(document.items())
    for index, (key, value) in enumerate(items):
        comma = "," if index < len(items) - 1 else ""
        if isinstance(value, list) and value:
            inner = ",\n".join(f"  {json.dumps(v, sort_keys=True)}" for v in value)
            lines.append(f"{json.dumps(key)}: [\n{inner}\n]{comma}")
        elif isinstance(value, dict) and value:
            inner = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{json.dumps(key)}: {{\n{inner}\n}}{comma}")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}{comma}")
    return "\n".join(lines) + "\n}\n"
