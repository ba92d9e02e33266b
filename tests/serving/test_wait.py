"""pd_appliance.serving.wait: several programs in one process, in order, stopping at the first failure.

The serving role waits for every worker and then the router with one command (and monitoring for its
programs), where a module run each cost the play ~0.5 s; what each program's wait says must stay
what it said when each had its own run: state, health, log tail, start-up record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pd_appliance.serving import wait


class FakeSupervisor:
    """supervisor.getProcessInfo over a fixed state per program, counting the asks."""

    def __init__(self, states: dict[str, str]) -> None:
        self.states = states
        self.asked: list[str] = []
        self.supervisor = self

    def getProcessInfo(self, name: str) -> dict[str, Any]:
        self.asked.append(name)
        return {"statename": self.states[name], "description": "pid 1", "start": 0}


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], states: dict, argv: list
) -> tuple:
    server = FakeSupervisor(states)
    monkeypatch.setattr(wait, "connect", lambda url: server)
    monkeypatch.setattr(wait, "probe", lambda url, timeout_s: {"status": 200})
    rc = wait.main(["--serverurl=unix:///x", "--timeout-s=1", "--interval-s=0.01", *argv])
    return rc, json.loads(capsys.readouterr().out), server


def test_every_program_in_order_then_ok(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = wait.wait_arguments("decode", {"decode": "http://d/health"}, "/logs", "") + wait.wait_arguments(
        "router", {"router": "http://r/readiness"}, "/logs", ""
    )
    rc, out, server = run(monkeypatch, capsys, {"pd:decode": "RUNNING", "pd:router": "RUNNING"}, argv)
    assert rc == 0 and out["ok"]
    assert [p["program"] for p in out["programs"]] == ["pd:decode", "pd:router"]
    assert server.asked == ["pd:decode", "pd:router"]


def test_it_stops_at_the_first_failure_with_its_log(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "prefill.log").write_text("CUDA out of memory\n")
    urls = {"prefill": "http://p/health", "decode": "http://d/health"}
    argv = wait.wait_arguments("prefill", urls, str(tmp_path)) + wait.wait_arguments(
        "decode", urls, str(tmp_path)
    )
    rc, out, server = run(monkeypatch, capsys, {"pd:prefill": "BACKOFF", "pd:decode": "RUNNING"}, argv)
    assert rc == 1 and not out["ok"]
    # decode is not waited for after a failure.
    assert [p["program"] for p in out["programs"]] == ["pd:prefill"]
    assert "BACKOFF" in out["programs"][0]["reason"] and "out of memory" in out["programs"][0]["log_tail"]
    assert "pd:decode" not in server.asked


def test_arguments_name_each_groups_log_and_record() -> None:
    urls = {"decode-0": "http://d/health", "router": "http://r/readiness", "prometheus": "http://p/-/ready"}
    assert wait.wait_arguments("decode-0", urls, "/logs", "/state/startup") == [
        "--program=pd:decode-0", "--url=http://d/health", "--log=/logs/decode-0.log",
        "--startup-record=/state/startup/decode-0.json",
    ]  # fmt: skip
    assert wait.wait_arguments("router", urls, "/logs", "/state/startup")[-1] == "--startup-record="
    assert wait.wait_arguments("prometheus", urls, "/logs", "", "monitor") == [
        "--program=monitor:prometheus", "--url=http://p/-/ready", "--log=/logs/monitor-prometheus.log",
        "--startup-record=",
    ]  # fmt: skip


def test_a_program_without_its_url_and_log_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        wait.main(
            ["--serverurl=unix:///x", "--program=pd:a", "--url=u", "--log=l", "--program=pd:b", "--url=v"]
        )
    assert exc.value.code == 2 and "once for each --program" in capsys.readouterr().err


def test_apply_then_wait_in_one_process_reports_both_and_fails_with_the_wait(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """monitoring applies its group and waits for it with one command (`apply --wait`): the applied
    actions and every program's wait are in the one JSON, and a program that does not come up fails
    the command although the apply itself succeeded."""
    from pd_appliance.serving import apply

    applied = {"changed": True, "actions": {"monitor:prometheus": "added"}}
    monkeypatch.setattr(apply, "connect", lambda url: object())
    monkeypatch.setattr(apply, "apply", lambda server, group, restart, log: dict(applied))
    monkeypatch.setattr(wait, "probe", lambda url, timeout_s: {"status": 200})
    argv = wait.wait_arguments("prometheus", {"prometheus": "http://p/-/ready"}, "/logs", "", "monitor")
    for state, rc_wanted in (("RUNNING", 0), ("FATAL", 1)):
        server = FakeSupervisor({"monitor:prometheus": state})
        monkeypatch.setattr(wait, "connect", lambda url, server=server: server)
        rc = apply.main(["--serverurl=unix:///x", "--group=monitor", "--wait", "--timeout-s=1", *argv])
        out = json.loads(capsys.readouterr().out)
        assert rc == rc_wanted, out
        assert out["actions"] == applied["actions"] and out["wait"]["ok"] is (rc_wanted == 0)
        assert server.asked and set(server.asked) == {"monitor:prometheus"}
