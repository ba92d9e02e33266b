"""playbooks/validate.yml end to end against the OpenAI test double: the gates fail the play with
measured vs threshold, and the report is on the controller whether the play passes or fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from validation_play_helpers import validation_extra_vars

from pd_testlib import ROOT, run_playbook

pytestmark = pytest.mark.slow

PLAYBOOK = "playbooks/validate.yml"
# The rehearsal's own common hooks (its engine's declared start-up rates), which an extra var replaces.
OVERLAY = ROOT / "inventory/rehearsal/group_vars/all/zz-standins.yml"
REHEARSAL_COMMON = yaml.safe_load(OVERLAY.read_text())["serving_env_common"]


def host_state(inventory: Path) -> Path:
    return inventory.parent.parent / ".rehearsal" / "root" / "var" / "lib" / "pd-appliance" / "validation"


def test_pass_accepts_then_regression_errors_and_floor_fail_with_report(
    tmp_path: Path, rehearsal_inventory_copy: Path, start_double
) -> None:
    # Requests last far longer than the /metrics sampling interval (0.2 s), so the decode-concurrency
    # check sees the batch: 16 tokens at 20 ms.
    fast = start_double("--tpot-ms", "20")
    first = run_playbook(
        PLAYBOOK,
        rehearsal_inventory_copy,
        *validation_extra_vars(
            tmp_path, fast.url, serving_env_common={**REHEARSAL_COMMON, "PD_SIM_TPOT_MS": "2"}
        ),
    )
    assert first.returncode == 0, first.stdout[-3000:]
    artifacts = tmp_path / "artifacts"
    report = json.loads((artifacts / "report.json").read_text())
    assert report["passed"] is True
    assert {p.name for p in artifacts.iterdir()} >= {"report.json", "report.md", "report.png"}
    assert report["metadata"]["gpus"][0]["name"].startswith("Simulated NVIDIA RTX PRO 6000")
    assert report["metadata"]["env_hooks"]["common"]["PD_SIM_TPOT_MS"] == "2"  # the hooks in force
    # validate.yml alone, before any checkpoint: the report says why it has no roofline (the roofline of
    # a converged layout: tests/foundation/test_pd_appliance_cli.py).
    assert "the checkpoint stage has not run" in report["roofline"]["error"]
    history = (host_state(rehearsal_inventory_copy) / "history.jsonl").read_text().splitlines()
    assert len(history) == 1
    c16_first = report["figures"]["C=16 output tok/s"]

    # Second run: 2x slower decode, one measured C=16 request stalls past the request timeout
    # (request 1 probe, 2 bs=1 warm-up, 3-6 bs=1, 7-22 C=16 warm-up, 23+ measured),
    # regression mode on, and a bs=1 floor set above anything this server can do.
    fast.stop()
    slow = start_double("--tpot-ms", "40", "--hang-requests", "30")
    second = run_playbook(
        PLAYBOOK,
        rehearsal_inventory_copy,
        *validation_extra_vars(
            tmp_path,
            slow.url,
            validation_regression_tolerance=0.2,
            validation_min_output_tok_s_bs1=100000.0,
            validation_request_timeout_s=2,
        ),
    )
    assert second.returncode != 0
    out = " ".join(second.stdout.split())
    assert "bs=1 output throughput" in out and "< threshold 100000.00 tok/s" in out
    assert "C=16 output throughput" in out and ">= threshold 1.00 tok/s" in out  # the other gate, for context
    assert "C=16: 1 of 32 requests failed (timeout: no complete answer within 2 s)" in out
    report = json.loads((artifacts / "report.json").read_text())
    assert report["passed"] is False
    failed = {g["name"] for g in report["gates"] if not g["passed"]}
    assert {"bs=1 output tok/s", "C=16 failed requests", "regression: C=16 output tok/s"} <= failed
    regression = next(g for g in report["gates"] if g["name"] == "regression: C=16 output tok/s")
    assert regression["limit"] == pytest.approx(c16_first * 0.8)
    assert "FAILED" in (artifacts / "report.md").read_text()
    # A failed run is not a baseline.
    assert len((host_state(rehearsal_inventory_copy) / "history.jsonl").read_text().splitlines()) == 1
    assert len(list((host_state(rehearsal_inventory_copy) / "runs").glob("*.json"))) == 2


def test_garbage_answer_fails_before_timing_and_report_is_fetched(
    tmp_path: Path, rehearsal_inventory_copy: Path, start_double
) -> None:
    garbage = start_double("--probe-answer", "Lyon Lyon Lyon")
    result = run_playbook(PLAYBOOK, rehearsal_inventory_copy, *validation_extra_vars(tmp_path, garbage.url))
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert "correctness probe failed" in out and "lacks 'Paris'" in out
    report = json.loads((tmp_path / "artifacts" / "report.json").read_text())
    assert report["variants"][0]["phases"] == []
    assert "not measured (the probe failed)" in (tmp_path / "artifacts" / "report.md").read_text()


def test_broken_measurement_still_writes_the_report(tmp_path: Path, rehearsal_inventory_copy: Path) -> None:
    # pd_bench itself fails (a workload it refuses): the rescue keeps the error, the report says it.
    result = run_playbook(
        PLAYBOOK,
        rehearsal_inventory_copy,
        *validation_extra_vars(tmp_path, "http://127.0.0.1:9", validation_output_len=1),
    )
    assert result.returncode != 0
    assert "output_len must be >= 2" in result.stdout
    report = json.loads((tmp_path / "artifacts" / "report.json").read_text())
    assert report["passed"] is False
    assert "output_len must be >= 2" in report["failure_message"]


def test_missing_threshold_fails_first_naming_the_variable(
    tmp_path: Path, rehearsal_inventory_copy: Path
) -> None:
    result = run_playbook(
        PLAYBOOK,
        rehearsal_inventory_copy,
        *validation_extra_vars(tmp_path, "http://127.0.0.1:9", validation_hardware_profile="no-such-profile"),
        "-e",
        '{"validation_min_output_tok_s_bs1": null}',
    )
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert "No usable throughput threshold: validation_min_output_tok_s_bs1=unset," in out
    assert "validation_min_output_tok_s_c16=1.0" in out
    assert "Set validation_hardware_profile to one of ['rehearsal_simulated']" in out.replace("''", "'")
    assert not (tmp_path / "artifacts").exists()
