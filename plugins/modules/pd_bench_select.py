#!/usr/bin/python
"""Ansible module pd_bench_select: the fastest A/B variant that passed the probe (pd_appliance.bench)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_bench_select
short_description: The fastest variant by a declared objective (output tok/s at one level, subject to floors)
description:
  - A variant is eligible when its correctness probe passed and, at I(concurrency) and every level of
    I(floors), it met the floor with no more failed requests than I(max_error_rate) allows and, at
    I(concurrency_levels), the decode workers ran as many requests as asked. The eligible variant
    with the highest output tok/s at I(concurrency) is C(fastest) (null when none is eligible);
    C(ranking) lists every variant with the reasons it is not eligible. Changes nothing.
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
  floors:
    description: "Minimum output tok/s per concurrency a variant must reach, e.g. C({1: 60, 16: 900})."
    type: dict
    default: {}
  max_error_rate:
    description: Fraction of requests per level allowed to fail.
    type: float
    default: 0
  concurrency_levels:
    description: Levels whose decode concurrency must reach the level (sglang:num_running_reqs peak).
    type: list
    elements: int
    default: []
"""

EXAMPLES = r"""
- name: Pick the fastest variant
  pd_bench_select:
    measurements: "{{ [tuning_deployed] + tuning_measurements }}"
    concurrency: 16
  register: tuning_selection
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
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "measurements": {"type": "list", "elements": "dict", "required": True},
            "concurrency": {"type": "int", "default": 16},
            "floors": {"type": "dict", "default": {}},
            "max_error_rate": {"type": "float", "default": 0.0},
            "concurrency_levels": {"type": "list", "elements": "int", "default": []},
        },
        supports_check_mode=True,
    )
    with tools_venv(module, "pd_appliance.bench is not importable ({err}): run with the tools venv"):
        from pd_appliance.bench.report import select_fastest
    p = module.params
    try:
        floors = {int(k): float(v) for k, v in p["floors"].items()}
    except (TypeError, ValueError):
        module.fail_json(msg=f"floors must map a concurrency to output tok/s, got {p['floors']!r}")
    selection = select_fastest(
        p["measurements"], p["concurrency"], floors, p["max_error_rate"], p["concurrency_levels"]
    )
    module.exit_json(changed=False, fastest=selection["fastest"], selection=selection)


if __name__ == "__main__":
    main()
