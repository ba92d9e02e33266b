"""The appliance modules' shared bootstrap: importing pd_appliance, or failing with what to do.

Each module imports pd_appliance inside main(), after AnsibleModule parsed its arguments, so that a
task run with a Python that lacks the package (the host's, before the appliance_tools role made the
tools venv) fails with a message naming the fix instead of a traceback. Ansible ships this file in
every module's AnsiballZ payload that imports it (ansible.cfg: module_utils = plugins/module_utils).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TOOLS_VENV = "pd_appliance is not importable ({err}): run the task with the tools venv's Python"


@contextmanager
def tools_venv(module: Any, message: str = TOOLS_VENV, **extra: Any) -> Iterator[None]:
    """Run the block's imports; an ImportError fails the module with `message`.

    `message` may name {err} (the ImportError) and {python} (the interpreter the task ran with);
    `extra` goes into the failed result as it is (e.g. a `cause` a role tests for).
    """
    try:
        yield
    except ImportError as err:
        module.fail_json(msg=message.format(err=err, python=sys.executable), **extra)
