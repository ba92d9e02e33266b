#!/usr/bin/python
"""Ansible module: prove a hashed lock against its index or wheelhouse (pd_appliance.supply.index)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_sglang_lock_check
short_description: Prove every entry of a hashed lock against the index or wheelhouse, installing nothing
description:
  - For each locked package, reads the index page (PEP 691 JSON or PEP 503 HTML) or the wheelhouse,
    picks the wheels a CPython C(python_version) on this machine can install and requires the sha256
    of one of them to be among the lock's hashes. Used where the CUDA stack is not installed
    (sglang_install_cuda_stack false), so that the full locked set is still resolved for real.
  - Read-only; runs in check mode.
options:
  lock:
    description: Host path of the hashed lock.
    type: path
    required: true
  python_version:
    description: Target Python (major.minor) whose wheel tags count.
    type: str
    required: true
  index_urls:
    description: Index URLs, tried in order per package; empty for PyPI.
    type: list
    elements: str
    default: []
  wheelhouse:
    description: Directory of wheels to check instead of an index.
    type: path
  workers:
    description: Concurrent index requests.
    type: int
    default: 16
author: pd-appliance
"""

EXAMPLES = r"""
- name: Prove the locked set against the index
  pd_sglang_lock_check:
    lock: /opt/pd-appliance/sglang/share/pd-appliance/lock/py3.12-x86_64.txt
    python_version: "3.12"
"""

RETURN = r"""
checked:
  description: Number of locked packages proven.
  type: int
  returned: always
problems:
  description: One line per package the source does not serve with a hash the lock admits.
  type: list
  elements: str
  returned: always
"""

from pathlib import Path  # noqa: E402  (Ansible wants DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "lock": {"type": "path", "required": True},
            "python_version": {"type": "str", "required": True},
            "index_urls": {"type": "list", "elements": "str", "default": []},
            "wheelhouse": {"type": "path"},
            "workers": {"type": "int", "default": 16},
        },
        supports_check_mode=True,
    )
    with tools_venv(module):
        from pd_appliance.supply import index, lock
    params = module.params
    try:
        entries = lock.read_lock(Path(params["lock"]))
    except (OSError, lock.LockError) as exc:
        module.fail_json(msg=f"cannot read the lock: {exc}")
    wheelhouse = Path(params["wheelhouse"]) if params["wheelhouse"] else None
    problems = index.check(
        entries, params["python_version"], params["index_urls"], wheelhouse, params["workers"]
    )
    source = str(wheelhouse) if wheelhouse else (", ".join(params["index_urls"]) or index.PYPI)
    result = {"changed": False, "checked": len(entries), "problems": problems}
    if problems:
        module.fail_json(
            msg=f"{len(problems)} of {len(entries)} locked packages fail against {source}", **result
        )
    module.exit_json(
        msg=f"{len(entries)} locked packages proven against {source} for Python {params['python_version']}",
        **result,
    )


if __name__ == "__main__":
    main()
