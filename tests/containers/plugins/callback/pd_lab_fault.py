"""Test-only callback: make a lab host go away when a given play (stage) starts.

Enabled only by the container lab's failure tests (ANSIBLE_CALLBACKS_ENABLED=pd_lab_fault). When
the first play whose name starts with $PD_LAB_FAULT_PLAY begins, it runs the argv in
$PD_LAB_FAULT_COMMAND (JSON), e.g. `docker kill` of the decode host's container. The run then
meets a host that vanished mid-run, the way a lab host that loses power would, without any change
to site.yml.
"""

from __future__ import annotations

import json
import os
import subprocess

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: pd_lab_fault
type: aggregate
short_description: take a lab host away when a named play starts (container lab failure tests)
description:
  - Runs $PD_LAB_FAULT_COMMAND (a JSON argv) once, when a play named $PD_LAB_FAULT_PLAY* starts.
requirements:
  - enabled in ANSIBLE_CALLBACKS_ENABLED
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "pd_lab_fault"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._play_prefix = os.environ.get("PD_LAB_FAULT_PLAY", "")
        self._command = json.loads(os.environ.get("PD_LAB_FAULT_COMMAND", "[]"))
        self._done = False

    def v2_playbook_on_play_start(self, play: object) -> None:
        name = play.get_name().strip()  # type: ignore[attr-defined]
        if self._done or not self._play_prefix or not self._command or not name.startswith(self._play_prefix):
            return
        self._done = True
        proc = subprocess.run(self._command, capture_output=True, text=True, check=False)
        said = f"{proc.stdout.strip()} {proc.stderr.strip()}".strip()
        self._display.display(f"PD_LAB_FAULT at the start of play '{name}' (rc={proc.returncode}): {said}")
