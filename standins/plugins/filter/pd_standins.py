"""Stand-in filters (see standins/declared.yml): pd_standins_sysfs_root writes (once) the PCI tree of
N simulated GPUs on the controller (the local rehearsal's host) and answers its sysfs root, and
pd_standins_import_path where a stand-in module imports from on the controller (the rehearsal's host),
for a product option that names a module and its path (appliance_nvml_module, appliance_nvml_path).

The controller's Python imports pd_standins (make venv installs it); without it, standins/src is used.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

try:
    import pd_standins  # noqa: F401
except ImportError:  # pragma: no cover - depends on how ansible-playbook was installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from pd_standins.sysfs import controller_tree


def standins_import_path(module: str) -> str:
    """The sys.path entry `module` (a pd_standins module) imports from in the controller's Python."""
    loaded = importlib.import_module(module)
    return str(Path(str(loaded.__file__)).resolve().parents[module.count(".")])


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_standins_sysfs_root": controller_tree,
            "pd_standins_import_path": standins_import_path,
        }
