#!/usr/bin/python
"""Ansible module: apply the SGLang patch series to an installed wheel (logic in pd_appliance.patches)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_sglang_patch_series
short_description: Apply a patch series to an installed Python package, idempotently
description:
  - Applies the patches listed in I(series_dir)/series, in order, to the package installed in
    I(site_packages), and records each patch's name and sha256 in I(marker).
  - A re-run with the same series and intact files changes nothing. A changed series (or files that
    drifted) first restores the pristine files, checked against the wheel's RECORD, then re-applies.
  - A hunk that does not apply fails naming the patch and the hunk, and changes nothing.
  - Runs with the tools venv's Python (pd_appliance must be importable). Supports check mode.
options:
  site_packages:
    description: site-packages directory that holds the package.
    type: path
    required: true
  series_dir:
    description: Directory with the C(series) file and the patches it lists.
    type: path
    required: true
  marker:
    description: JSON file recording the applied series.
    type: path
    required: true
  pristine_dir:
    description: Where the pristine copies of patched files are kept.
    type: path
    required: true
  package:
    description: Distribution name.
    type: str
    default: sglang
  version:
    description: Installed version the series is written against.
    type: str
    required: true
  wheel:
    description: The package's wheel file, a pristine source preferred over the saved copies.
    type: path
author: pd-appliance
"""

EXAMPLES = r"""
- name: Apply the SGLang patch series
  pd_sglang_patch_series:
    site_packages: /opt/pd-appliance/sglang/lib/python3.11/site-packages
    series_dir: /opt/pd-appliance/sglang/share/pd-appliance/patches
    marker: /opt/pd-appliance/sglang/pd-appliance-patches.json
    pristine_dir: /opt/pd-appliance/sglang/pd-appliance-pristine
    version: "0.5.23"
"""

RETURN = r"""
action:
  description: unchanged, applied, reapplied (series changed) or repaired (files had drifted).
  type: str
  returned: success
patches:
  description: The series as applied, each with name and sha256.
  type: list
  returned: success
patched_files:
  description: Absolute paths of every file the series touches (to byte-compile).
  type: list
  returned: success
restored_files:
  description: Files put back to pristine because the new series no longer touches them.
  type: list
  returned: success
"""

from pathlib import Path  # noqa: E402  (Ansible wants DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "site_packages": {"type": "path", "required": True},
            "series_dir": {"type": "path", "required": True},
            "marker": {"type": "path", "required": True},
            "pristine_dir": {"type": "path", "required": True},
            "package": {"type": "str", "default": "sglang"},
            "version": {"type": "str", "required": True},
            "wheel": {"type": "path", "required": False},
        },
        supports_check_mode=True,
    )
    with tools_venv(module):
        from pd_appliance.patches import PatchError, apply_series
    p = module.params
    try:
        result = apply_series(
            site_packages=Path(p["site_packages"]),
            series_dir=Path(p["series_dir"]),
            marker=Path(p["marker"]),
            pristine_dir=Path(p["pristine_dir"]),
            package=p["package"],
            version=p["version"],
            wheel=Path(p["wheel"]) if p["wheel"] else None,
            check_mode=module.check_mode,
        )
    except PatchError as exc:
        module.fail_json(msg=str(exc))
    out = result.to_dict()
    for warning in out.pop("warnings"):
        module.warn(warning)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
