"""Every serve run applies the adopted variant recorded on the host (roles/serving/tasks/variant.yml).

One render-only run of playbooks/serve.yml over four lab hosts: one with the variant in its host
state (ansible_local.pd_appliance.variant; a damaged adopted-variant file beside it is not read),
one with a variant recorded in the adopted-variant file by a tuner from before the host state (its
overrides land in the rendered programs), one with the same record and
serving_apply_adopted_variant=false (the inventory as is), one with a damaged record (that host
fails naming the file and the fix; the others go on).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from pd_appliance.bench.variants import record
from pd_standins.gpus import simulated_gpu
from pd_testlib import ROOT, run_playbook

pytestmark = pytest.mark.slow

CONF_D = "etc/pd-appliance/supervisor/conf.d"
RECORD = "var/lib/pd-appliance/tuning/adopted-variant.json"
STATE = "etc/ansible/facts.d/pd_appliance.fact"
# MTP is off as shipped (roles/serving/defaults/main.yml): a variant turning it on changes the flags.
MTP_ON = {"name": "mtp-1", "description": "MTP on, 1 step",
          "vars": {"serving_speculative_algorithm": "EAGLE", "serving_speculative_num_steps": 1,
                   "serving_speculative_num_draft_tokens": 2},
          "env_hooks": {"decode": {"SGLANG_OPT_SM120_DIRECT_SWA_KV": "1"}}}  # fmt: skip


def test_serve_applies_the_recorded_variant_unless_told_not_to(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory/lab/group_vars", inventory / "group_vars")
    hosts = {}
    for name, text, extra in (
        ("state", "{not json", {}),
        ("adopted", json.dumps(record(MTP_ON, objective="test")), {}),
        ("ignored", json.dumps(record(MTP_ON)), {"serving_apply_adopted_variant": False}),
        ("damaged", "{not json", {}),
    ):
        root = tmp_path / name
        (root / RECORD).parent.mkdir(parents=True)
        (root / RECORD).write_text(text)
        if name == "state":
            (root / STATE).parent.mkdir(parents=True)
            (root / STATE).write_text(json.dumps({"variant": record(MTP_ON, objective="test")}))
        hosts[name] = {"appliance_root": str(root), "serving_advertise_host": "192.0.2.10", **extra}
    # The damaged host is a router only: the others' router sections list every prefill and decode host.
    groups = {
        role: {"hosts": dict.fromkeys(["state", "adopted", "ignored"])} for role in ("prefill", "decode")
    }
    groups["router"] = {"hosts": dict.fromkeys(hosts)}
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump({"pd_appliance": {"children": groups, "hosts": hosts}})
    )
    owner, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    gpus = [
        dict(simulated_gpu(i), name="NVIDIA RTX PRO 6000 Blackwell", simulated=False, stand_in=None)
        for i in range(8)
    ]
    variables = {
        "ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable,
        "pd_gpus": gpus, "serving_render_only": True, "serving_supervisor_manager": "direct",
        "serving_config_owner": owner, "serving_config_group": group, "serving_secrets_owner": owner,
        "serving_supervisor_socket_owner": owner,
    }  # fmt: skip
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    result = run_playbook(
        "playbooks/serve.yml",
        inventory / "hosts.yml",
        "--tags",
        "serving_render",
        "-e",
        f"@{tmp_path / 'vars.json'}",
    )
    out = " ".join(result.stdout.split()).replace("''", "'")
    assert result.returncode != 0
    assert (
        f"{tmp_path / 'damaged' / RECORD} is not JSON" in out
        and "remove it to serve the inventory as is" in out
    )
    assert "adopted serves the adopted variant 'mtp-1' (MTP on, 1 step)" in out
    assert "state serves the adopted variant 'mtp-1' (MTP on, 1 step)" in out
    assert f"Recorded in {tmp_path / 'state' / STATE} (variant)" in out
    assert f"{tmp_path / 'state' / RECORD} is not JSON" not in out
    from_state = (tmp_path / "state" / CONF_D / "decode.conf").read_text()
    assert "--speculative-algorithm" in from_state and 'SGLANG_OPT_SM120_DIRECT_SWA_KV="1"' in from_state
    adopted = (tmp_path / "adopted" / CONF_D / "decode.conf").read_text()
    ignored = (tmp_path / "ignored" / CONF_D / "decode.conf").read_text()
    assert "--speculative-algorithm" in adopted and 'SGLANG_OPT_SM120_DIRECT_SWA_KV="1"' in adopted
    assert "--speculative-algorithm" in (tmp_path / "adopted" / CONF_D / "prefill.conf").read_text()
    assert "--speculative-algorithm" not in ignored and "SGLANG_OPT_SM120_DIRECT_SWA_KV" not in ignored
    assert not (tmp_path / "damaged" / CONF_D).exists()
