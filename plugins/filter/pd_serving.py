"""Serving filters: thin wrappers over pd_appliance.serving (GPU pinning, env hooks, commands)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    import pd_appliance  # noqa: F401
except ImportError:  # pragma: no cover - depends on how ansible-playbook was installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from ansible.errors import AnsibleFilterError

from pd_appliance.serving import commands, pinning, supervisor_format


def _wrap(function: Any) -> Any:
    def filter_(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except ValueError as exc:
            raise AnsibleFilterError(str(exc)) from exc

    filter_.__name__ = function.__name__
    filter_.__doc__ = function.__doc__
    return filter_


def _merge_env(layers: list[Any]) -> dict[str, str]:
    return supervisor_format.merge_env(*layers)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_serving_check_gpu_sets": _wrap(pinning.check_gpu_sets),
            "pd_serving_gpu_binding": _wrap(pinning.gpu_binding),
            "pd_serving_merge_env": _wrap(_merge_env),
            "pd_serving_supervisor_environment": _wrap(supervisor_format.supervisor_environment),
            "pd_serving_supervisor_command": _wrap(supervisor_format.supervisor_command),
            "pd_serving_env_file": _wrap(supervisor_format.env_file_lines),
            "pd_serving_sglang_argv": _wrap(commands.sglang_argv),
            "pd_serving_router_argv": _wrap(commands.router_argv),
            "pd_serving_worker_url": _wrap(commands.worker_url),
        }
