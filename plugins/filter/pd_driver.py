"""Driver filters: thin wrappers over pd_appliance.supply.ubuntu_driver (Canonical's signed modules).

They run on the controller, so preflight can judge the archive before any tools venv exists.
"""

from __future__ import annotations

from typing import Any

from pd_appliance.supply import ubuntu_driver


def pd_ubuntu_driver_plan(
    madison: str | None,
    module_show: str | None,
    userspace_package: str,
    module_package: str,
    branch: str,
    version: str,
    host: str = "",
) -> dict[str, Any]:
    """{reachable, carried, driver, userspace_version, module_version, module_drivers, problems, note}."""
    return ubuntu_driver.plan(
        madison or "",
        module_show or "",
        userspace_package=userspace_package,
        module_package=module_package,
        branch=str(branch),
        version=str(version or ""),
        host=host,
    ).as_dict()


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {"pd_ubuntu_driver_plan": pd_ubuntu_driver_plan}
