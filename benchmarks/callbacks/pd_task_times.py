"""Ansible callback pd_task_times: each task's wall time, written as JSON when the run ends.

What ansible.posix's profile_tasks prints, kept as data (benchmarks/noop_rerun.py reads it): for each
task in the order run, its file:line, name, action, seconds, and whether it ran (ok/changed) or was
skipped on every host. Enabled only by that benchmark (ANSIBLE_CALLBACKS_ENABLED), writing to
PD_TASK_TIMES_OUT.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: pd_task_times
type: aggregate
short_description: Each task's wall time as JSON (PD_TASK_TIMES_OUT)
description:
  - Records every task's wall time, action and outcome; writes the list to the file PD_TASK_TIMES_OUT names.
requirements:
  - enabled in ANSIBLE_CALLBACKS_ENABLED
"""


class CallbackModule(CallbackBase):
    """Times each task from its start to the next task's start (or the end of the run)."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "pd_task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.started = 0.0

    def _close(self) -> None:
        if self.current is not None:
            self.current["seconds"] = round(time.monotonic() - self.started, 4)
            self.rows.append(self.current)
            self.current = None

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close()
        self.current = {"path": task.get_path() or "", "name": task.get_name(), "action": task.action}
        self.current["ran"] = False
        self.started = time.monotonic()

    def _ran(self, *_: Any) -> None:
        if self.current is not None:
            self.current["ran"] = True

    v2_runner_on_ok = _ran
    v2_runner_on_failed = _ran
    v2_runner_item_on_ok = _ran

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close()
        out = os.environ.get("PD_TASK_TIMES_OUT")
        if out:
            with open(out, "w", encoding="utf-8") as handle:
                json.dump(self.rows, handle)
