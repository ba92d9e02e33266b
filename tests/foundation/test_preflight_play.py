"""Preflight as the user meets it: broken inventories stop the play at preflight, named, unchanged.

Each case copies the rehearsal inventory, breaks one thing in group_vars, runs the real
ansible-playbook and checks the message and that nothing was created.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pd_testlib import reserve_ports, run_playbook

pytestmark = pytest.mark.slow


def break_inventory(inventory: Path, **overrides: object) -> None:
    (inventory / "group_vars" / "all" / "zz_broken.yml").write_text(yaml.safe_dump(overrides))


# Ports the broken inventories name twice: reserved, so that no program on the machine holds one and
# preflight's listener check adds a problem the cases do not expect (test_all_problems counts them).
DUPLICATE, DUPLICATE_TOO = reserve_ports(2)

CASES = {
    "overlapping_gpus": (
        {"serving_decode_gpus": [2, 3, 4, 5]},
        "share GPU [2, 3]",
    ),
    "tp4_with_three_gpus": (
        {"serving_prefill_gpus": [0, 1, 2]},
        "serving_prefill_tp_size=4 but serving_prefill_gpus has 3 GPU(s)",
    ),
    "duplicate_ports": (
        {"serving_router_port": DUPLICATE, "serving_prefill_port": DUPLICATE},
        f"port {DUPLICATE} is used by serving_prefill_port and serving_router_port",
    ),
    "missing_model_path": (
        {"appliance_model_dir": ""},
        "required variable appliance_model_dir is not set",
    ),
    "gpu_beyond_host": (
        {"serving_decode_gpus": [4, 5, 6, 9]},
        "names GPU [9], but the host has 8 GPU(s)",
    ),
    "wrong_type": (
        {"serving_decode_port": "thirty-thousand"},
        "serving_decode_port",
    ),
    # Checked by preflight against the role's own argument spec, before that role runs.
    "wrong_type_of_a_later_role": (
        {"serving_worker_startsecs": "soon", "nixl_check_size_mib": "lots"},
        "- 'role serving: argument ''serving_worker_startsecs'' is of type str",
    ),
    # The day2 role has no main: preflight checks the options of every entry point (its plays').
    "wrong_type_of_a_day2_knob": (
        {"day2_profile_requests": "many"},
        "- 'role day2: argument ''day2_profile_requests'' is of type str",
    ),
    # The variant role's knobs, under their new names and the old serving_* ones (still honoured).
    "wrong_type_of_a_variant_knob": (
        {"variant_apply_adopted": "sometimes"},
        "- 'role variant: argument ''variant_apply_adopted'' is of type str",
    ),
    "wrong_type_of_a_variant_knob_under_its_old_name": (
        {"serving_apply_adopted_variant": "sometimes"},
        "- 'role variant: argument ''serving_apply_adopted_variant'' is of type str",
    ),
    "instances_overlap_and_share_a_port": (
        {
            "serving_instances": [
                {"role": "prefill", "gpus": [0, 1], "tp_size": 2, "port": 47100, "bootstrap_port": 47102},
                {"role": "decode", "gpus": [1, 2], "tp_size": 2, "port": 47101},
                {"role": "decode", "gpus": [4, 5], "tp_size": 2, "port": 47101},
            ]
        },
        "serving_instances[0].gpus=[0, 1] and serving_instances[1].gpus=[1, 2] share GPU [1]",
    ),
    "instance_without_bootstrap_port": (
        {
            "serving_instances": [
                {"role": "prefill", "gpus": [0, 1], "port": 47100},
                {"role": "decode", "gpus": [2, 3], "port": 47101},
            ]
        },
        "serving_instances[0].bootstrap_port must be a TCP port (1-65535), got None",
    ),
    # The lab's checkpoint size on one GPU: 149 GB of weights against 0.88 x 97887 MiB.
    "tp1_share_exceeds_gpu_memory": (
        {
            "checkpoint_size_bytes": 149000000000,
            "serving_instances": [
                {"role": "prefill", "gpus": [0, 1], "port": 47100, "bootstrap_port": 47102},
                {"role": "decode", "gpus": [2], "port": 47101},
            ],
        },
        "pd:decode (decode, tp_size 1 on GPU(s) [2]) needs 149000000000 bytes (138.8 GiB) of weights per "
        "GPU (checkpoint 149000000000 bytes from checkpoint_size_bytes / tp_size 1), but a GPU offers "
        "90324923842 bytes (84.1 GiB): 0.88 (serving_mem_fraction_static) of its 97887 MiB "
        "(preflight_gpu_memory_mib, the lab GPU's; no NVML facts before the driver). In serving_instances "
        "give it at least 2 GPUs (tp_size 2)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_inventory_stops_at_preflight(case: str, rehearsal_inventory_copy: Path) -> None:
    overrides, expected = CASES[case]
    break_inventory(rehearsal_inventory_copy, **overrides)
    result = run_playbook("site.yml", rehearsal_inventory_copy)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert expected in output, output[-4000:]
    # The play ended in preflight: no later stage started and nothing was written.
    assert "PLAY [Provision" not in output
    rehearsal_root = rehearsal_inventory_copy.parent.parent / ".rehearsal"
    assert not rehearsal_root.exists(), f"preflight must change nothing, but {rehearsal_root} exists"


def test_all_problems_reported_in_one_run(rehearsal_inventory_copy: Path) -> None:
    break_inventory(
        rehearsal_inventory_copy,
        serving_decode_gpus=[3, 4, 5, 6],
        serving_router_port=DUPLICATE_TOO,
        serving_decode_port=DUPLICATE_TOO,
    )
    result = run_playbook("playbooks/preflight.yml", rehearsal_inventory_copy)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Preflight found 2 problem(s); nothing was changed" in output, output[-4000:]


def test_rehearsal_inventory_passes_preflight(rehearsal_inventory_copy: Path) -> None:
    result = run_playbook("playbooks/preflight.yml", rehearsal_inventory_copy)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "preflight passed on localhost" in result.stdout
    # The GPU stand-in's PCI tree (preflight_sysfs_root) names itself, and its 8 GPUs are counted.
    flat = " ".join(result.stdout.split())
    assert "STAND-IN (PCI tree of the simulated GPUs (pd_standins.sysfs" in flat
    assert "module parameters of this host) (8 NVIDIA GPUs in it)" in flat
