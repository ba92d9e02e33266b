"""Filters shared by every stage. Logic lives in pd_appliance; this file only registers it.

The controller's Python must be able to import pd_appliance. When ansible-playbook runs from a
Python that lacks it (a system Ansible), the checkout's src/ is used instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import pd_appliance  # noqa: F401
except ImportError:  # pragma: no cover - depends on how ansible-playbook was installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from pd_appliance.simulated import simulated_gpu


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {"pd_simulated_gpu": simulated_gpu}
