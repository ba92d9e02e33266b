"""Monitoring follows the serving topology: one scrape target and one GPU assignment per instance.

The monitor stage renders (monitoring_render_only) for the rehearsal host running 1P TP2 + 3D TP2
(serving_instances); prometheus.yml and the GPU exporter's command line are read back.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from supervisor.options import UnhosedConfigParser

from pd_testlib import run_playbook

pytestmark = pytest.mark.slow

LAYOUT = [
    {"role": "prefill", "gpus": [0, 1], "tp_size": 2, "port": 30000, "bootstrap_port": 8998},
    {"role": "decode", "gpus": [2, 3], "tp_size": 2, "port": 30001},
    {"role": "decode", "gpus": [4, 5], "tp_size": 2, "port": 30002},
    {"role": "decode", "gpus": [6, 7], "tp_size": 2, "port": 30003},
]


def render_monitoring(base: Path, layout: list[dict]) -> Path:
    """The monitor stage rendered (not started) for `layout` under `base`; its config directory."""
    variables = base / "vars.json"
    variables.write_text(json.dumps({"appliance_root": str(base / "root"), "monitoring_render_only": True,
                                     "serving_instances": layout}))  # fmt: skip
    done = run_playbook("playbooks/monitor.yml", "inventory/rehearsal", "-e", f"@{variables}", timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    return base / "root" / "etc" / "pd-appliance"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    return render_monitoring(tmp_path_factory.mktemp("monitor-topology"), LAYOUT)


def test_prometheus_scrapes_every_instance_with_its_program_name(rendered: Path) -> None:
    config = yaml.safe_load((rendered / "monitoring/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    targets = [(c["targets"], c["labels"]) for c in jobs["sglang"]["static_configs"]]
    assert targets == [
        (["127.0.0.1:30000"], {"host": "localhost", "role": "prefill", "pd_instance": "prefill"}),
        (["127.0.0.1:30001"], {"host": "localhost", "role": "decode", "pd_instance": "decode-0"}),
        (["127.0.0.1:30002"], {"host": "localhost", "role": "decode", "pd_instance": "decode-1"}),
        (["127.0.0.1:30003"], {"host": "localhost", "role": "decode", "pd_instance": "decode-2"}),
    ]
    # Each worker URL smg reports gets its worker_type and its inventory host (worker_host).
    smg_relabel = jobs["smg"]["metric_relabel_configs"]
    relabel = [(r["regex"], r["target_label"], r["replacement"]) for r in smg_relabel]
    assert len(relabel) == 8
    for port, role in ((30000, "prefill"), (30001, "decode"), (30002, "decode"), (30003, "decode")):
        matching = [(t, r) for regex, t, r in relabel if re.fullmatch(regex, f"http://127.0.0.1:{port}")]
        assert matching == [("worker_type", role), ("worker_host", "localhost")], (port, relabel)


def test_gpu_exporter_assigns_each_gpu_to_its_instance(rendered: Path) -> None:
    parser = UnhosedConfigParser()
    parser.read_string((rendered / "supervisor/conf.d/60-group-monitor.conf").read_text())
    argv = shlex.split(parser.get("program:gpu_exporter", "command"))
    assert [a for a in argv if a.startswith("--assign=")] == [
        "--assign=prefill:prefill=0,1", "--assign=decode:decode-0=2,3",
        "--assign=decode:decode-1=4,5", "--assign=decode:decode-2=6,7",
    ]  # fmt: skip
    assert "--expect-gpus=8" in argv


AGGREGATED = [
    {"role": "aggregated", "gpus": [0, 1, 2, 3], "tp_size": 4, "port": 30000},
    {"role": "aggregated", "gpus": [4, 5, 6, 7], "tp_size": 4, "port": 30001},
]


@pytest.fixture(scope="module")
def rendered_aggregated(tmp_path_factory) -> Path:
    return render_monitoring(tmp_path_factory.mktemp("monitor-aggregated"), AGGREGATED)


def test_aggregated_replicas_are_scraped_and_alerted_on_as_smgs_one_worker_type(
    rendered_aggregated: Path, tmp_path: Path
) -> None:
    """Every aggregated engine is a target; the router alert counts smg's aggregated workers (regular
    mode has no prefill or decode, whose alerts would fire for ever) and fires once none is healthy."""
    config = yaml.safe_load((rendered_aggregated / "monitoring/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    targets = [(c["targets"], c["labels"]["pd_instance"]) for c in jobs["sglang"]["static_configs"]]
    assert targets == [(["127.0.0.1:30000"], "aggregated-0"), (["127.0.0.1:30001"], "aggregated-1")]
    assert {c["labels"]["role"] for c in jobs["sglang"]["static_configs"]} == {"aggregated"}
    relabel = jobs["smg"]["metric_relabel_configs"]
    assert {r["replacement"] for r in relabel if r["target_label"] == "worker_type"} == {"aggregated"}
    assert {r["replacement"] for r in relabel if r["target_label"] == "worker_host"} == {"localhost"}
    rules = yaml.safe_load((rendered_aggregated / "monitoring/rules/pd-appliance.rules.yml").read_text())
    router_alerts = [
        r for g in rules["groups"] for r in g["rules"] if r.get("alert", "").startswith("PDRouterNoAvailable")
    ]
    assert [r["alert"] for r in router_alerts] == ["PDRouterNoAvailableAggregated"]
    for rule in router_alerts:
        rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "r", "rules": router_alerts}]}))
    health = 'smg_worker_health{{job="smg",worker="http://127.0.0.1:{port}",worker_type="aggregated"}}'
    series = [
        {"series": 'up{job="smg"}', "values": "1x40"},
        {"series": health.format(port=30000), "values": "1x4 0x36"},  # both down from 1 min on
        {"series": health.format(port=30001), "values": "1x4 0x36"},
    ]
    fires = {"severity": "critical", "worker_type": "aggregated"}
    alert = "PDRouterNoAvailableAggregated"
    case = {"interval": "15s", "input_series": series, "alert_rule_test": [
        {"eval_time": "1m30s", "alertname": alert, "exp_alerts": []},
        {"eval_time": "3m", "alertname": alert, "exp_alerts": [{"exp_labels": fires}]},
    ]}  # fmt: skip
    one_left = dict(case, input_series=[*series[:2], {"series": health.format(port=30001), "values": "1x40"}])
    one_left["alert_rule_test"] = [
        {"eval_time": "3m", "alertname": "PDRouterNoAvailableAggregated", "exp_alerts": []}
    ]
    spec = {
        "rule_files": [str(tmp_path / "rules.yml")],
        "evaluation_interval": "15s",
        "tests": [case, one_left],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    done = subprocess.run(["promtool", "test", "rules", str(tmp_path / "test.yml")], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
