# ruff: noqa: E501 (the case table below reads best one case per line)
"""The alert rules as the role renders them: promtool checks them, and `promtool test rules` makes
every alert fire on the series that should raise it and stay quiet on a healthy deployment.

The rules and the Prometheus configuration are rendered by the monitoring role itself
(monitoring_render_only) against the rehearsal inventory, with the defaults' thresholds.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from monitoring_testlib import find_sglang_wheel, wheel_metrics

from pd_testlib import run_playbook

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian: prometheus) is absent"
)

HOST = "localhost"
DECODE_URL = "http://127.0.0.1:30001"
PREFILL_URL = "http://127.0.0.1:30000"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """The role's render-only run: rules, prometheus.yml and the supervisor section under a private root."""
    base = tmp_path_factory.mktemp("monitor-render")
    variables = base / "vars.json"
    variables.write_text(json.dumps({"appliance_root": str(base / "root"), "monitoring_render_only": True}))
    done = run_playbook("playbooks/monitor.yml", "inventory/rehearsal", "-e", f"@{variables}", timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    return base / "root" / "etc" / "pd-appliance"


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120, check=False)


def test_promtool_accepts_the_rules_and_the_configuration(rendered: Path) -> None:
    rules = _promtool("check", "rules", str(rendered / "monitoring/rules/pd-appliance.rules.yml"))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = _promtool("check", "config", "--syntax-only", str(rendered / "monitoring/prometheus.yml"))
    assert config.returncode == 0, config.stdout + config.stderr


def test_every_alert_of_the_issue_exists(rendered: Path) -> None:
    groups = yaml.safe_load((rendered / "monitoring/rules/pd-appliance.rules.yml").read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}
    assert alerts == {
        "PDWorkerDown", "PDRouterDown", "PDRouterNoAvailablePrefill", "PDRouterNoAvailableDecode",
        "PDTTFTP99High", "PDTPOTP99High", "PDKVTransferFailures", "PDGPUOffBus", "PDGPUNVMLDown",
        "PDGPUXidErrors", "PDExporterDown", "PDModelDiskNearlyFull", "PDHostOutOfRotation",
    }  # fmt: skip
    # The per-host rotation (issue 27): one recorded series per PD host of the deployment.
    recorded = [rule for group in groups for rule in group["rules"] if rule.get("record")]
    assert [(r["record"], r["labels"]) for r in recorded] == [
        ("pd_appliance_fleet_in_rotation", {"host": HOST})
    ]


def test_rules_use_only_sglang_0_5_23_metric_names(rendered: Path) -> None:
    wheel = find_sglang_wheel()
    if wheel is None:
        pytest.skip("the sglang 0.5.23 wheel is absent (make wheels)")
    known = wheel_metrics(wheel)
    text = (rendered / "monitoring/rules/pd-appliance.rules.yml").read_text()
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"sglang:[a-z0-9_]+", text)}
    assert used and used <= set(known), used - set(known)


# ---- promtool test rules ---------------------------------------------------------------------
def _worker(role: str) -> str:
    port = 30000 if role == "prefill" else 30001
    return f'{{job="sglang",host="{HOST}",role="{role}",pd_instance="{role}",instance="127.0.0.1:{port}"}}'


def _gpu(gpu: int, role: str) -> str:
    return f'{{job="gpu",host="{HOST}",gpu="{gpu}",role="{role}",pd_instance="{role}",stand_in=""}}'


def _smg(name: str, url: str, worker_type: str) -> str:
    return (
        f'{name}{{job="smg",host="{HOST}",worker="{url}",worker_type="{worker_type}",worker_host="{HOST}"}}'
    )


def _healthy(minutes: int = 12) -> list[dict[str, str]]:
    """One healthy single-host deployment, sampled every 15 s for `minutes`."""
    n = minutes * 4
    series = [
        {"series": f"up{_worker('prefill')}", "values": f"1x{n}"},
        {"series": f"up{_worker('decode')}", "values": f"1x{n}"},
        {"series": f'up{{job="smg",host="{HOST}"}}', "values": f"1x{n}"},
        {"series": f'up{{job="node",host="{HOST}"}}', "values": f"1x{n}"},
        {"series": f'up{{job="gpu",host="{HOST}"}}', "values": f"1x{n}"},
        {"series": _smg("smg_worker_health", PREFILL_URL, "prefill"), "values": f"1x{n}"},
        {"series": _smg("smg_worker_health", DECODE_URL, "decode"), "values": f"1x{n}"},
        {"series": _smg("smg_worker_cb_state", PREFILL_URL, "prefill"), "values": f"0x{n}"},
        {"series": _smg("smg_worker_cb_state", DECODE_URL, "decode"), "values": f"0x{n}"},
        {"series": f'pd_gpu_nvml_up{{job="gpu",host="{HOST}",stand_in=""}}', "values": f"1x{n}"},
        {"series": f'pd_gpu_expected_count{{job="gpu",host="{HOST}",stand_in=""}}', "values": f"2x{n}"},
        {"series": f"pd_gpu_up{_gpu(0, 'prefill')}", "values": f"1x{n}"},
        {"series": f"pd_gpu_up{_gpu(1, 'decode')}", "values": f"1x{n}"},
        {"series": f"pd_gpu_xid_events_total{_gpu(1, 'decode')}", "values": f"0x{n}"},
    ]
    for role in ("prefill", "decode"):
        for counter in ("num_transfer_failed_reqs_total", "num_bootstrap_failed_reqs_total"):
            series.append({"series": f"sglang:{counter}{_worker(role)}", "values": f"0x{n}"})
    # TTFT 0.3 s and TPOT 15 ms on every one of 10 requests a second.
    for metric, bounds, inside in (
        ("time_to_first_token_seconds", ("0.2", "0.4", "10", "20", "+Inf"), "0.4"),
        ("request_time_per_output_token_seconds", ("0.01", "0.015", "0.2", "0.4", "+Inf"), "0.015"),
    ):
        for le in bounds:
            step = 150 if float(le) >= float(inside) else 0
            labels = _worker("decode")[:-1] + f',is_streaming="true",le="{le}"}}'
            series.append({"series": f"sglang:{metric}_bucket{labels}", "values": f"0+{step}x{n}"})
    mount = '{job="node",host="localhost",mountpoint="/"}'
    series.append({"series": f"node_filesystem_size_bytes{mount}", "values": f"1000x{n}"})
    series.append({"series": f"node_filesystem_avail_bytes{mount}", "values": f"500x{n}"})
    return series


def _replace(series: list[dict[str, str]], name: str, values: str) -> list[dict[str, str]]:
    assert any(s["series"] == name for s in series), name
    return [{"series": s["series"], "values": values if s["series"] == name else s["values"]} for s in series]


def _quiet_everywhere(eval_time: str) -> list[dict[str, Any]]:
    return [{"eval_time": eval_time, "alertname": a, "exp_alerts": []} for a in ALERTS]


ALERTS = [
    "PDWorkerDown", "PDRouterDown", "PDRouterNoAvailablePrefill", "PDRouterNoAvailableDecode",
    "PDTTFTP99High", "PDTPOTP99High", "PDKVTransferFailures", "PDGPUOffBus", "PDGPUNVMLDown",
    "PDGPUXidErrors", "PDExporterDown", "PDModelDiskNearlyFull", "PDHostOutOfRotation",
]  # fmt: skip


def _fires(alert: str, at: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": labels}]}


def _quiet(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def _case(series: list[dict[str, str]], checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"interval": "15s", "input_series": series, "alert_rule_test": checks}


def _cases() -> dict[str, dict[str, Any]]:
    h = _healthy()
    decode = {
        "job": "sglang",
        "host": HOST,
        "role": "decode",
        "pd_instance": "decode",
        "instance": "127.0.0.1:30001",
    }
    gpu1 = {
        "job": "gpu",
        "host": HOST,
        "gpu": "1",
        "role": "decode",
        "pd_instance": "decode",
    }
    # decode down from minute 2: quiet at 2m30 (for 1m not yet over), firing at 4m, quiet again after it is back.
    down = _replace(h, f"up{_worker('decode')}", "1x8 0x8 1x31")
    slow_ttft = h
    for le, values in (
        ("0.2", "0x48"),
        ("0.4", "0x48"),
        ("10", "0x48"),
        ("20", "0+150x48"),
        ("+Inf", "0+150x48"),
    ):
        slow_ttft = _replace(slow_ttft, f"sglang:time_to_first_token_seconds_bucket{_worker('decode')[:-1]},is_streaming=\"true\",le=\"{le}\"}}", values)  # fmt: skip
    slow_tpot = h
    for le, values in (
        ("0.01", "0x48"),
        ("0.015", "0x48"),
        ("0.2", "0x48"),
        ("0.4", "0+150x48"),
        ("+Inf", "0+150x48"),
    ):
        slow_tpot = _replace(slow_tpot, f"sglang:request_time_per_output_token_seconds_bucket{_worker('decode')[:-1]},is_streaming=\"true\",le=\"{le}\"}}", values)  # fmt: skip
    # smg forgets every worker of the host from minute 1 (a drain): its series go; out of rotation once
    # Prometheus' 5 m lookback has passed (6m), PDHostOutOfRotation after its 30 m (36m), not before.
    drained = _healthy(40)
    for url, worker_type in ((PREFILL_URL, "prefill"), (DECODE_URL, "decode")):
        for name in ("smg_worker_health", "smg_worker_cb_state"):
            drained = _replace(drained, _smg(name, url, worker_type), "1x4 _x155")
    return {
        "healthy": _case(h, _quiet_everywhere("11m")),
        "host_out_of_rotation": _case(drained, [
            _quiet("PDHostOutOfRotation", "30m"),
            _fires("PDHostOutOfRotation", "38m", {"host": HOST, "severity": "warning"}),
        ]),
        "host_out_of_rotation_router_down": _case(_replace(drained, f'up{{job="smg",host="{HOST}"}}', "1x4 0x156"), [
            _quiet("PDHostOutOfRotation", "38m"),  # the router down is PDRouterDown, not this
        ]),
        "worker_down": _case(down, [
            _quiet("PDWorkerDown", "2m30s"), _fires("PDWorkerDown", "3m45s", {**decode, "severity": "critical"}),
            _quiet("PDWorkerDown", "5m"),
        ]),
        "router_down": _case(_replace(h, f'up{{job="smg",host="{HOST}"}}', "1x4 0x44"), [
            _fires("PDRouterDown", "3m", {"job": "smg", "host": HOST, "severity": "critical"}),
            _quiet("PDRouterNoAvailablePrefill", "3m"),  # a router that is down is PDRouterDown, not this
        ]),
        "no_prefill": _case(_replace(h, _smg("smg_worker_health", PREFILL_URL, "prefill"), "1x4 0x44"), [
            _fires("PDRouterNoAvailablePrefill", "3m", {"severity": "critical", "worker_type": "prefill"}),
            _quiet("PDRouterNoAvailableDecode", "3m"),
        ]),
        "decode_circuit_open": _case(_replace(h, _smg("smg_worker_cb_state", DECODE_URL, "decode"), "0x4 1x44"), [
            _fires("PDRouterNoAvailableDecode", "3m", {"severity": "critical", "worker_type": "decode"}),
            _quiet("PDRouterNoAvailablePrefill", "3m"),
        ]),
        "slow_ttft": _case(slow_ttft, [
            _fires("PDTTFTP99High", "11m", {"host": HOST, "pd_instance": "decode", "severity": "warning"}),
            _quiet("PDTPOTP99High", "11m"),
        ]),
        "slow_tpot": _case(slow_tpot, [
            _fires("PDTPOTP99High", "11m", {"host": HOST, "pd_instance": "decode", "severity": "warning"}),
            _quiet("PDTTFTP99High", "11m"),
        ]),
        "kv_transfer_failures": _case(_replace(h, f"sglang:num_transfer_failed_reqs_total{_worker('decode')}", "0x20 1x27"), [
            _quiet("PDKVTransferFailures", "4m"),
            _fires("PDKVTransferFailures", "6m", {"host": HOST, "role": "decode", "pd_instance": "decode", "severity": "warning"}),
        ]),
        "gpu_lost": _case(_replace(h, f"pd_gpu_up{_gpu(1, 'decode')}", "1x8 0x40"), [
            _quiet("PDGPUOffBus", "1m"), _fires("PDGPUOffBus", "3m", {**gpu1, "severity": "critical"}),
        ]),
        "gpu_missing": _case([s for s in h if s["series"] != f"pd_gpu_up{_gpu(1, 'decode')}"], [
            _fires("PDGPUOffBus", "1m", {"host": HOST, "severity": "critical"}),
        ]),
        "nvml_down": _case(_replace(h, f'pd_gpu_nvml_up{{job="gpu",host="{HOST}",stand_in=""}}', "1x4 0x44"), [
            _fires("PDGPUNVMLDown", "3m", {"job": "gpu", "host": HOST, "severity": "critical"}),
        ]),
        "xid": _case(_replace(h, f"pd_gpu_xid_events_total{_gpu(1, 'decode')}", "0x20 1x27"), [
            _quiet("PDGPUXidErrors", "4m"), _fires("PDGPUXidErrors", "6m", {**gpu1, "severity": "critical"}),
        ]),
        "node_exporter_down": _case(_replace(h, f'up{{job="node",host="{HOST}"}}', "1x4 0x44"), [
            _fires("PDExporterDown", "3m", {"job": "node", "host": HOST, "severity": "warning"}),
        ]),
        "model_disk_full": _case(
            _replace(h, 'node_filesystem_avail_bytes{job="node",host="localhost",mountpoint="/"}', "500x4 50x44"), [
                _quiet("PDModelDiskNearlyFull", "3m"),
                _fires("PDModelDiskNearlyFull", "8m", {"job": "node", "host": HOST, "mountpoint": "/", "severity": "warning"}),
            ]),
    }  # fmt: skip


def _logic_only(rendered: Path, tmp_path: Path) -> Path:
    """The rendered rules without annotations (text for humans; `promtool check rules` checks their
    templates): promtool test rules then compares alert labels only."""
    rules = yaml.safe_load((rendered / "monitoring/rules/pd-appliance.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


@pytest.mark.parametrize("case", list(_cases()))
def test_alert_fires_on_its_symptom_and_only_then(case: str, rendered: Path, tmp_path: Path) -> None:
    rules = _logic_only(rendered, tmp_path)
    disk = [
        r
        for g in yaml.safe_load(rules.read_text())["groups"]
        for r in g["rules"]
        if r.get("alert") == "PDModelDiskNearlyFull"
    ]
    assert disk and 'mountpoint="/"' in disk[0]["expr"], "the rehearsal's model dir is on / here"
    spec = {"rule_files": [str(rules)], "evaluation_interval": "15s", "tests": [_cases()[case]]}
    test_file = tmp_path / "test.yml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = _promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rule_tests_can_fail(rendered: Path, tmp_path: Path) -> None:
    """A wrong expectation is reported: promtool's verdict is what the cases above rely on."""
    case = _cases()["worker_down"]
    case["alert_rule_test"] = [_quiet("PDWorkerDown", "3m45s")]
    spec = {
        "rule_files": [str(_logic_only(rendered, tmp_path))],
        "evaluation_interval": "15s",
        "tests": [case],
    }
    (tmp_path / "t.yml").write_text(yaml.safe_dump(spec))
    done = _promtool("test", "rules", str(tmp_path / "t.yml"))
    assert done.returncode != 0 and "PDWorkerDown" in done.stdout + done.stderr


def test_rendered_targets_follow_the_serving_variables(rendered: Path) -> None:
    config = yaml.safe_load((rendered / "monitoring/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"sglang", "smg", "node", "gpu", "prometheus"}
    sglang = {c["labels"]["role"]: c["targets"] for c in jobs["sglang"]["static_configs"]}
    assert sglang == {"prefill": ["127.0.0.1:30000"], "decode": ["127.0.0.1:30001"]}
    assert jobs["smg"]["static_configs"][0]["targets"] == ["127.0.0.1:29000"]
    relabels = jobs["smg"]["metric_relabel_configs"]
    relabel = {r["replacement"]: r["regex"] for r in relabels if r["target_label"] == "worker_type"}
    # worker_host: the inventory host of each worker URL (pd_appliance_fleet_in_rotation counts by it).
    hosts = [(r["regex"], r["replacement"]) for r in relabels if r["target_label"] == "worker_host"]
    matched = [h for rx, h in hosts if re.fullmatch(rx, DECODE_URL) or re.fullmatch(rx, PREFILL_URL)]
    assert matched == [HOST, HOST]
    assert re.fullmatch(relabel["decode"], DECODE_URL) and not re.fullmatch(relabel["decode"], PREFILL_URL)
