"""Load the appliance's Jinja filter and test plugins once, in the controller's main process.

ansible-core 2.19 runs every task in a worker forked from ansible-playbook's main process
(ansible/utils/multiprocessing.py: the 'fork' context), and each worker loads the filter plugins
it templates with, unless the module is already in sys.modules (PluginLoader._load_module_source).
The main process never loads them itself, so every task re-imported the appliance's ten filter
files and the pd_appliance modules behind them: about 0.2 s of CPU per task, a third of a no-op
re-run (benchmarks/ansible_task_overhead.py measures it). Loaded here once, every forked worker
inherits them. Enabled in ansible.cfg (callbacks_enabled); it prints nothing.

It is also the filters' one bootstrap: they import pd_appliance, which the checkout's venv (`make venv`)
has installed; an ansible-playbook installed otherwise (a distribution's, pipx's) lacks it, so the
checkout's src/ goes on sys.path here, before any filter loads, instead of in every filter file.
"""

from __future__ import annotations

DOCUMENTATION = """
name: pd_plugin_preload
type: aggregate
short_description: load the filter and test plugins once, before tasks fork
description:
  - Imports every filter and test plugin on the configured paths in ansible-playbook's main process,
    so the forked task workers inherit them instead of importing them for each task.
requirements:
  - enabled in callbacks_enabled (ansible.cfg)
"""

import sys  # noqa: E402 (after DOCUMENTATION, as ansible's own)
from pathlib import Path  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402 (after DOCUMENTATION, as ansible's own)
from ansible.plugins.loader import filter_loader, test_loader  # noqa: E402


def pd_appliance_importable() -> None:
    """Put the checkout's src/ on sys.path when this Python cannot import pd_appliance (see above)."""
    try:
        import pd_appliance  # noqa: F401
    except ImportError:  # depends on how ansible-playbook was installed
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


class CallbackModule(CallbackBase):
    """Aggregate callback whose only work is the import, at construction (before any task forks)."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "pd_plugin_preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        pd_appliance_importable()
        for loader in (filter_loader, test_loader):
            for _plugin in loader.all():
                pass
