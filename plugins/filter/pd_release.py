"""Release filters (controller side): the build id that names an SGLang venv, and the patch series it carries.

They read the patch series and lock files on the controller, so every stage derives the same
appliance_sglang_venv (pd_appliance.release.build) without asking a host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

from pd_appliance.release import ReleaseError, build


def pd_release_build_id(dirs: list[str]) -> str:
    """[sglang_patch_series_dir, sglang_lock_dir(, sglang_kernels_dir)] -> the 12-hex build id of the venv."""
    if not isinstance(dirs, list | tuple) or len(dirs) not in (2, 3):
        raise AnsibleFilterError(
            "pd_release_build_id takes [sglang_patch_series_dir, sglang_lock_dir, sglang_kernels_dir]"
        )
    try:
        kernels = Path(str(dirs[2])) if len(dirs) == 3 else None
        return build.build_id(Path(str(dirs[0])), Path(str(dirs[1])), kernels)
    except ReleaseError as exc:
        raise AnsibleFilterError(exc.message) from exc


def pd_release_series(series_dir: str) -> list[dict[str, str]]:
    """The patch series of sglang_patch_series_dir as the venv records it: [{name, sha256}] in order."""
    try:
        return build.series_identity(Path(str(series_dir)))
    except ReleaseError as exc:
        raise AnsibleFilterError(exc.message) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"pd_release_build_id": pd_release_build_id, "pd_release_series": pd_release_series}
