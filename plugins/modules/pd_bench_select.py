#!/usr/bin/python
"""Ansible module pd_bench_select: the fastest A/B variant that passed the probe (pd_appliance.bench)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_bench_select
short_description: Rank measured variants by output tok/s at one concurrency
description:
  - Only variants whose correctness probe passed and that had no failed request at I(concurrency)
    are eligible. Returns C(fastest) (null when none is eligible) and C(ranking). Changes nothing.
options:
  measurements:
    description: C(measurement) results of pd_bench, one per variant.
    type: list
    elements: dict
    required: true
  concurrency:
    description: Level whose output tok/s decides.
    type: int
    default: 16
"""

EXAMPLES = r"""
- name: Pick the fastest variant
  pd_bench_select:
    measurements: "{{ validation_measurements }}"
    concurrency: 16
  register: validation_selection
"""

RETURN = r"""
fastest:
  description: Name of the fastest eligible variant, or null.
  returned: always
  type: str
selection:
  description: concurrency, fastest and the full ranking.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "measurements": {"type": "list", "elements": "dict", "required": True},
            "concurrency": {"type": "int", "default": 16},
        },
        supports_check_mode=True,
    )
    try:
        from pd_appliance.bench.report import select_fastest
    except ImportError as err:
        module.fail_json(msg=f"pd_appliance.bench is not importable ({err}): run with the tools venv")
    selection = select_fastest(module.params["measurements"], module.params["concurrency"])
    module.exit_json(changed=False, fastest=selection["fastest"], selection=selection)


if __name__ == "__main__":
    main()
