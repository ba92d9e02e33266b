"""pd-appliance: summaries from job events, secret redaction, and one real ansible-runner run."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pd_appliance import cli
from pd_testlib import ansible_env


def events():
    return [
        {"event": "playbook_on_play_start", "event_data": {"play": "Preflight - validate"}},
        {"event": "playbook_on_play_start", "event_data": {"play": "Serve - supervisor"}},
        {
            "event": "runner_on_failed",
            "event_data": {
                "host": "h1",
                "task": "Wait for decode",
                "res": {"msg": ["decode", "not healthy"]},
            },
        },
        {
            "event": "runner_on_failed",
            "event_data": {"host": "h1", "task": "ignored", "ignore_errors": True, "res": {"msg": "x"}},
        },
        {
            "event": "playbook_on_stats",
            "event_data": {
                "ok": {"h1": 10},
                "changed": {"h1": 3},
                "failures": {"h1": 1},
                "skipped": {"h1": 2},
            },
        },
    ]


def test_summary_counts_stages_changes_and_failures():
    summary = cli.summarize_events(events())
    assert summary.stages == ["Preflight - validate", "Serve - supervisor"]
    assert summary.hosts == {"h1": {"ok": 10, "changed": 3, "failures": 1, "skipped": 2}}
    assert summary.failures == ["h1: Wait for decode: decode; not healthy"]


def _fetch_event(*dests: Path) -> dict:
    """What roles/validation's fetch loop reports (runner_on_ok of the loop, an item per file)."""
    results = [{"dest": str(d), "changed": True} for d in dests]
    return {"event": "runner_on_ok", "event_data": {"host": "node1", "res": {"results": results},
            "task": "validation : Fetch the report to the controller"}}  # fmt: skip


def test_summary_screen_shows_the_validation_figures_of_the_reports_this_run_fetched(tmp_path: Path):
    report_dir = tmp_path / "elsewhere" / "validation" / "node1"  # validation_artifacts_dir set by the user
    report_dir.mkdir(parents=True)
    (report_dir / "report.json").write_text(
        json.dumps(
            {
                "passed": False,
                "gates": [
                    {"name": "bs1 output tok/s", "measured": 41.0, "limit": 40.0, "passed": True},
                    {"name": "c16 output tok/s", "measured": 90.0, "limit": 100.0, "passed": False},
                    {
                        "name": "engine start-up node1/decode",
                        "passed": True,
                        "message": "pd:decode on node1: no fallback in its start-up log",
                        "measured": None,
                        "limit": None,
                    },
                    {"name": "ttft regression", "measured": 1.5, "limit": None, "passed": True},
                ],
            }
        )
    )
    summary = cli.summarize_events(
        [*events(), _fetch_event(report_dir / "report.md", report_dir / "report.json")]
    )
    summary.status, summary.rc = "failed", 2
    screen = cli.render_summary(summary, tmp_path / "run")
    assert "stages: Preflight - validate -> Serve - supervisor" in screen
    assert "c16 output tok/s: 90.0 (limit 100.0) FAILED" in screen
    assert "engine start-up node1/decode: ok (pd:decode on node1: no fallback in its start-up log)" in screen
    assert "ttft regression: 1.5 ok" in screen
    assert "None" not in screen
    assert "node1: validation FAIL" in screen
    assert len(screen.splitlines()) < 40


def test_summary_leaves_out_reports_this_run_did_not_fetch(tmp_path: Path):
    """A report in the checkout's artifacts/ from another run (another inventory, a concurrent run)
    says nothing about this one, however recent."""
    report = tmp_path / "artifacts" / "validation" / "node1" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text(
        json.dumps({"passed": True, "gates": [{"name": "g", "measured": 1, "limit": 0, "passed": True}]})
    )
    run_dir = tmp_path / "artifacts" / "runs" / "20261203T060256.168987Z-deploy"
    assert "validation" not in cli.render_summary(cli.summarize_events(events()), run_dir)
    fetched = cli.summarize_events([*events(), _fetch_event(report)])
    assert "node1: validation PASS" in cli.render_summary(fetched, run_dir)


def test_summary_reads_the_report_the_controller_copy_wrote(tmp_path: Path):
    """roles/validation writes the controller's copy from pd_bench_report's result (no fetch): the
    copy command's stdout names report.json, and the summary shows that report's gates."""
    report = tmp_path / "validation" / "node1" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text(
        json.dumps({"passed": True, "gates": [{"name": "g", "measured": 2, "limit": 1, "passed": True}]})
    )
    paths = {"json": str(report), "markdown": str(report.with_suffix(".md")), "png": None}
    task = "validation : " + cli.REPORT_COPY_TASK
    copied = {"event": "runner_on_ok", "event_data": {"host": "node1", "task": task,
              "res": {"rc": 0, "stdout": json.dumps(paths)}}}  # fmt: skip
    failed_copy = {"event": "runner_on_ok", "event_data": {"host": "node2", "task": task,
                   "res": {"rc": 1, "stdout": "", "stderr": "No module named pd_appliance"}}}  # fmt: skip
    summary = cli.summarize_events([*events(), copied, failed_copy])
    assert summary.reports == [("node1", str(report))]
    assert "node1: validation PASS" in cli.render_summary(summary, tmp_path / "run")


def test_status_shows_each_hosts_state_from_the_status_play(tmp_path: Path):
    """playbooks/day2/status.yml prints ansible_local.pd_appliance per host; the summary says it in a line."""
    state = {
        "release": {"current": "r-1", "status": "accepted", "accepted": "r-1"},
        "variant": {"name": "mtp-1"},
    }
    shown = {"event": "runner_on_ok", "event_data": {"host": "node1", "task": cli.HOST_STATE_TASK,
             "res": {"msg": state}}}  # fmt: skip
    summary = cli.summarize_events([*events(), shown])
    assert summary.host_states == {
        "node1": "release r-1 [accepted]; newest accepted r-1; variant mtp-1; no checkpoint recorded"
    }
    screen = cli.render_summary(summary, tmp_path / "run")
    assert "host state (ansible_local.pd_appliance):\n  node1: release r-1 [accepted]" in screen


def test_scrub_secrets_redacts_tokens(tmp_path: Path):
    run = tmp_path / "artifacts" / "run"
    run.mkdir(parents=True)
    (run / "command").write_text(
        json.dumps({"command": ["x"], "env": {"HF_TOKEN": "hf_abc", "PATH": "/bin"}})
    )
    cli.scrub_secrets(tmp_path)
    data = json.loads((run / "command").read_text())
    assert data["env"] == {"HF_TOKEN": "<redacted>", "PATH": "/bin"}


@pytest.mark.slow
def test_deploy_preflight_records_a_run(repo_root: Path, rehearsal_inventory_copy: Path):
    binary = Path(sys.executable).parent / "pd-appliance"
    result = subprocess.run(
        [str(binary), "deploy", "-i", str(rehearsal_inventory_copy), "--tags", "preflight", "-q"],
        cwd=repo_root,
        env=ansible_env(),  # the rehearsal's filter path, as `make deploy` sets it
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pd-appliance run: successful (rc=0)" in result.stdout
    run_dir = Path(result.stdout.split("artifacts: ", 1)[1].splitlines()[0])
    assert run_dir.parent == repo_root / "artifacts" / "runs"
    assert list(run_dir.glob("artifacts/run/job_events/*.json")), "job events were not kept"
    assert (run_dir / "artifacts" / "run" / "stdout").is_file()
    assert "Preflight" in result.stdout.split("stages: ", 1)[1]


def test_extra_vars_go_to_a_private_file_and_secrets_are_scrubbed(tmp_path: Path):
    from_file = tmp_path / "vars.yml"
    from_file.write_text("serving_router_api_key: from-file-key-123\n")
    merged = cli.private_extra_vars(
        ["checkpoint_hf_token=hf_planted_777 validation_num_requests=3", '{"x": [1, 2]}', f"@{from_file}"]
    )
    assert merged == {
        "checkpoint_hf_token": "hf_planted_777",
        "validation_num_requests": "3",
        "x": [1, 2],
        "serving_router_api_key": "from-file-key-123",
    }
    assert sorted(cli.secret_values(merged)) == ["from-file-key-123", "hf_planted_777"]
    ns = cli.build_parser().parse_args(["deploy", "-e", "checkpoint_hf_token=hf_planted_777"])
    args = cli.extra_args_from(ns, tmp_path / "private.json")
    assert args == ["-e", f"@{tmp_path / 'private.json'}"] and "hf_planted_777" not in " ".join(args)
    run = tmp_path / "run"
    (run / "artifacts" / "run" / "job_events").mkdir(parents=True)
    (run / "artifacts" / "run" / "job_events" / "1.json").write_text('{"stdout": "token hf_planted_777"}')
    cli.scrub_values(run, cli.secret_values(merged))
    assert "hf_planted_777" not in (run / "artifacts" / "run" / "job_events" / "1.json").read_text()
    with pytest.raises(SystemExit, match="expected key=value"):
        cli.private_extra_vars(["not-a-pair"])


def test_the_extra_vars_file_is_0600_in_a_0700_directory_while_ansible_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """README (Security): `pd-appliance deploy -e ...` hands every extra var to Ansible through a private
    0600 file. main() runs with the playbook run replaced by one that looks at the file it is given."""
    seen: dict[str, object] = {}

    def fake_run(root: Path, command: str, inventory: str, extra_args, quiet: bool = False):
        vars_file = Path(extra_args[extra_args.index("-e") + 1][1:])
        seen["mode"] = stat.S_IMODE(vars_file.stat().st_mode)
        seen["dir_mode"] = stat.S_IMODE(vars_file.parent.stat().st_mode)
        seen["values"] = json.loads(vars_file.read_text())
        seen["args"] = list(extra_args)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        return cli.RunSummary(status="successful", rc=0), run_dir

    monkeypatch.setattr(cli, "run_playbook", fake_run)
    old = os.umask(0o000)  # the most permissive umask a user could have: the file must still be 0600
    try:
        rc = cli.main(["deploy", "-i", str(tmp_path), "-q", "-e", "checkpoint_hf_token=hf_planted_0600"])
    finally:
        os.umask(old)
    assert rc == 0
    assert seen["values"] == {"checkpoint_hf_token": "hf_planted_0600"}
    assert oct(seen["mode"]) == "0o600" and oct(seen["dir_mode"]) == "0o700", seen
    assert "hf_planted_0600" not in " ".join(seen["args"])  # type: ignore[arg-type]
    assert not Path(str(seen["args"][1])[1:]).exists(), "the private file outlives the run"  # type: ignore[index]
