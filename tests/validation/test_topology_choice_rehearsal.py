"""The tuner chooses between PD and aggregated replicas by what they measure (issue 24, item 5).

Real supervisord, smg and rehearsal engine, driven by the real roles on a private copy of the
rehearsal inventory. Each topology's speed is injected through the rehearsal engine's per-token
time, PD_SIM_TPOT_MS (pd_standins.engine; its env hooks are how a rehearsal sets the engine's speed,
as tests/validation/test_ab_rehearsal.py does), carried by the candidate variant's env hooks for its
own engines: `decode` for a PD layout's decode, `aggregated` for the aggregated replicas.

1. The lab layout (1P TP4 + 1D TP4, decode at the engine's default 10 ms/token) is deployed; the
   topology stage measures agg-2x-tp4 at 4 ms/token: the aggregated layout is faster, the tuner
   adopts it, smg runs in its regular mode over both replicas, the PD programs are gone, and the
   decode-concurrency gate read both aggregated engines' running requests (16 at C=16, 8 each).
2. A second tuning measures pd-1p4-1d4 (the PD layout, decode at 2 ms/token) against what is
   deployed now (the adopted aggregated layout, 4 ms): PD is faster, the tuner adopts it, smg is back
   in PD mode and the aggregated programs are gone.
3. A later plain serve run keeps the adopted PD layout: nothing restarts.
After step 1, `playbooks/day2/status.yml` reports the adopted layout's programs (aggregated-0/1), as
every day-2 play acts on what runs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pd_standins.hub import generate
from pd_testlib import reserve_ports, run_playbook

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def programs(config: Path) -> dict[str, str]:
    status = subprocess.run(
        [str(BIN / "supervisorctl"), "-c", str(config), "status"], capture_output=True, text=True, check=False
    ).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r"^pd:([\w-]+)\s+RUNNING\s+pid (\d+)", status, re.M)}


def c16(report: dict) -> dict[str, dict]:
    return {
        v["variant"]: next(p for p in v["phases"] if p["concurrency"] == 16)
        for v in report["variants"]
        if v["phases"]
    }


def test_the_tuner_picks_aggregated_replicas_when_faster_and_pd_when_that_is_faster(
    tmp_path: Path, rehearsal_inventory_copy: Path
) -> None:
    prefill, decode, bootstrap, router, metrics, agg0, agg1 = reserve_ports(7)
    venv = str(BIN.parent)
    run_dir = tempfile.mkdtemp(prefix="pdt-", dir="/tmp")  # a short supervisor socket path
    common = {
        "serving_supervisor_run_dir": run_dir, "appliance_tools_venv": venv, "appliance_router_venv": venv,
        "serving_prefill_port": prefill, "serving_decode_port": decode, "serving_bootstrap_port": bootstrap,
        "serving_router_port": router, "serving_router_metrics_port": metrics,
        "serving_router_api_key": "topology-choice-key",
    }  # fmt: skip
    aggregated = {
        "name": "agg-2x-tp4", "description": "2 aggregated TP4 replicas at 4 ms/token",
        "vars": {"serving_instances": [
            {"role": "aggregated", "gpus": [0, 1, 2, 3], "tp_size": 4, "port": agg0},
            {"role": "aggregated", "gpus": [4, 5, 6, 7], "tp_size": 4, "port": agg1},
        ]},
        "env_hooks": {"aggregated": {"PD_SIM_TPOT_MS": "4"}},
    }  # fmt: skip
    pd = {
        "name": "pd-1p4-1d4", "description": "the lab's PD layout, decode at 2 ms/token",
        "vars": {"serving_instances": [
            {"role": "prefill", "gpus": [0, 1, 2, 3], "tp_size": 4, "port": prefill,
             "bootstrap_port": bootstrap},
            {"role": "decode", "gpus": [4, 5, 6, 7], "tp_size": 4, "port": decode},
        ]},
        "env_hooks": {"decode": {"PD_SIM_TPOT_MS": "2"}},
    }  # fmt: skip
    root = rehearsal_inventory_copy.parent.parent / ".rehearsal" / "root"
    generate(root / "srv" / "models" / "DeepSeek-V4-Flash-NVFP4" / "main")  # the tokenizer validation reads
    config = root / "etc" / "pd-appliance" / "supervisor" / "supervisord.conf"
    conf_d = config.parent / "conf.d"
    # The host state (ansible_local.pd_appliance): the tuner records the variant it adopts there.
    fact = root / "etc" / "ansible" / "facts.d" / "pd_appliance.fact"

    def tune(candidate: dict, name: str) -> dict:
        extra = common | {
            "validation_tune": True, "validation_variants": [candidate],
            "validation_tune_search": [{"name": "topology", "variants": [candidate["name"]], "keep": 1}],
            "validation_artifacts_dir": str(tmp_path / name), "validation_num_requests": [4, 32],
            "validation_output_len": 64, "validation_decode_metrics_interval_s": 0.2,
            # Two tuning runs on one host: the second's deployed figures are not the first's to regress from.
            "validation_regression_tolerance": None,
        }  # fmt: skip
        done = run_playbook(
            "playbooks/validate.yml", rehearsal_inventory_copy, "-e", json.dumps(extra), timeout=1500
        )
        assert done.returncode == 0, done.stdout[-4000:]
        return json.loads((tmp_path / name / "report.json").read_text())

    try:
        served = run_playbook("playbooks/serve.yml", rehearsal_inventory_copy, "-e", json.dumps(common))
        assert served.returncode == 0, served.stdout[-3000:]
        assert set(programs(config)) == {"prefill", "decode", "router"}

        # 1. Aggregated replicas faster than the deployed PD layout: adopted, smg in regular mode.
        report = tune(aggregated, "to-aggregated")
        figures = c16(report)
        assert figures["agg-2x-tp4"]["output_tok_s"] > figures["deployed"]["output_tok_s"], figures
        assert report["passed"] and report["selected_variant"] == "agg-2x-tp4"
        # The running-requests gate summed both aggregated engines: 16 at C=16.
        assert figures["agg-2x-tp4"]["decode_running"]["peak"] == 16, figures["agg-2x-tp4"]["decode_running"]
        assert json.loads(fact.read_text())["variant"]["name"] == "agg-2x-tp4"
        assert set(programs(config)) == {"aggregated-0", "aggregated-1", "router"}
        router_conf = (conf_d / "router.conf").read_text()
        assert "--discovery-provider file" in router_conf and "--pd-disaggregation" not in router_conf
        assert not (conf_d / "prefill.conf").exists() and not (conf_d / "decode.conf").exists()
        # Day 2 acts on what runs: status names the adopted layout's programs (playbooks/served_layout.yml),
        # not the inventory's prefill and decode, which no longer exist.
        status = run_playbook("playbooks/day2/status.yml", rehearsal_inventory_copy, "-e", json.dumps(common))
        assert status.returncode == 0, status.stdout[-3000:]
        flat = " ".join(status.stdout.split())
        assert "aggregated-0" in flat and "aggregated-1" in flat, flat[-3000:]
        assert "ABSENT" not in flat, flat[-3000:]
        # It shows the host state (ansible_local.pd_appliance): the variant adopted, the release accepted.
        shown = flat.split("TASK [Show the host state]", 1)[1].split("TASK [", 1)[0]
        assert "name: agg-2x-tp4" in shown and "status: accepted" in shown, shown

        # 2. Now PD is the faster one: adopted over the aggregated layout in force, smg back in PD mode.
        report = tune(pd, "to-pd")
        figures = c16(report)
        assert figures["pd-1p4-1d4"]["output_tok_s"] > figures["deployed"]["output_tok_s"], figures
        assert report["selected_variant"] == "pd-1p4-1d4" and report["passed"]
        assert json.loads(fact.read_text())["variant"]["name"] == "pd-1p4-1d4"
        after = programs(config)
        assert set(after) == {"prefill", "decode", "router"}
        router_conf = (conf_d / "router.conf").read_text()
        assert "--pd-disaggregation" in router_conf and "--discovery-provider file" in router_conf
        assert not list(conf_d.glob("aggregated*.conf"))

        # 3. A later serve keeps the adopted PD layout: the same programs, nothing restarted.
        again = run_playbook("playbooks/serve.yml", rehearsal_inventory_copy, "-e", json.dumps(common))
        assert again.returncode == 0, again.stdout[-3000:]
        assert "serves the adopted variant 'pd-1p4-1d4'" in " ".join(again.stdout.split()).replace("''", "'")
        assert programs(config) == after
    finally:
        if config.exists():
            subprocess.run(
                [str(BIN / "supervisorctl"), "-c", str(config), "shutdown"], check=False, timeout=60
            )
        shutil.rmtree(run_dir, ignore_errors=True)
