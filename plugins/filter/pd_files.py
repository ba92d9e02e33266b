"""File filters: entries for the pd_config_files module (plugins/modules/pd_config_files.py)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any


def directory_entries(paths: list[str], owner: Any = None, group: Any = None, mode: Any = None) -> list[dict]:
    """pd_config_files `directories` entries: each path with the same owner, group and mode."""
    return [{"path": str(path), "owner": owner, "group": group, "mode": mode} for path in paths]


def copied_file_entries(
    sources: list[str], dest_dir: str, owner: Any = None, group: Any = None, mode: Any = None
) -> list[dict]:
    """pd_config_files `files` entries copying controller text files into dest_dir (names kept).

    What ansible.builtin.copy of a directory of small text files does, for one module run instead of
    two per file. The content is read here, on the controller, byte for byte (UTF-8 text only).
    """
    return [
        {
            "path": f"{dest_dir.rstrip('/')}/{Path(source).name}",
            "content": Path(source).read_text(encoding="utf-8"),
            "owner": owner,
            "group": group,
            "mode": mode,
        }
        for source in sorted(sources)
    ]


def controller_slurp(path: str) -> dict:
    """A controller file shaped like ansible.builtin.slurp's result ({} when it is missing).

    For the controller's own build records: a filter reads them in the play's process, where a
    delegated slurp would cost a module run (docs/molecule.md, "No-op re-run").
    """
    try:
        return {"content": base64.b64encode(Path(path).read_bytes()).decode("ascii"), "source": str(path)}
    except FileNotFoundError:
        return {}


def file_sha256(path: str) -> str:
    """sha256 (hex) of a controller file: a delegated stat would cost a module run."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_directory_entries": directory_entries,
            "pd_copied_file_entries": copied_file_entries,
            "pd_controller_slurp": controller_slurp,
            "pd_file_sha256": file_sha256,
        }
