"""File filters: entries for the pd_config_files module (plugins/modules/pd_config_files.py)."""

from __future__ import annotations

from typing import Any


def directory_entries(paths: list[str], owner: Any = None, group: Any = None, mode: Any = None) -> list[dict]:
    """pd_config_files `directories` entries: each path with the same owner, group and mode."""
    return [{"path": str(path), "owner": owner, "group": group, "mode": mode} for path in paths]


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {"pd_directory_entries": directory_entries}
