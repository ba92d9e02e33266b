"""The per-fault figures of pd_appliance.bench.faults, from known request timelines, and its faults."""

from __future__ import annotations

import pytest

from pd_appliance.bench import faults
from pd_appliance.bench.faults import Sample, figures


def test_a_worker_kill_timeline() -> None:
    samples = [
        Sample(0.0, 0.5, None),  # answered before the fault at 1.0
        Sample(0.6, 1.2, "server error: stream cut"),  # in flight, failed
        Sample(0.8, 1.4, None),  # in flight, survived
        Sample(1.1, 3.5, None),  # sent after: waited in the retries
        Sample(1.5, 3.2, None),
    ]
    looks = [(0.9, True), (1.1, False), (1.6, False), (2.9, True), (3.1, True)]
    f = figures(samples, 1.0, looks)
    assert (f["sent"], f["in_flight"], f["failed"], f["failed_in_flight"]) == (5, 2, 1, 1)
    assert (f["failed_after"], f["served_after"]) == (0, 2)
    assert f["first_served_s"] == 2.2 and f["recovered_s"] == 2.2 and f["fail_window_s"] == 0.0
    assert f["wait_max_s"] == 2.4 and f["baseline_latency_s"] == 0.5
    assert (f["not_ready_s"], f["ready_again_s"]) == (0.1, 1.9)
    assert f["errors"] == {"server error": 1}


def test_a_router_kill_timeline() -> None:
    samples = [
        Sample(0.5, 1.1, "ClientPayloadError: cut"),
        Sample(1.2, 1.2, "ClientConnectorError: refused"),
        Sample(1.9, 1.9, "ClientConnectorError: refused"),
        Sample(1.4, 1.45, "HTTP 503: no workers"),
        Sample(2.3, 2.9, None),
        Sample(2.0, 2.7, None),  # sent inside the window yet answered: not "recovered"
    ]
    f = figures(samples, 1.0)
    assert (f["in_flight"], f["failed_in_flight"], f["failed_after"], f["served_after"]) == (1, 1, 3, 2)
    assert f["fail_window_s"] == 0.9
    assert f["first_served_s"] == 1.7 and f["recovered_s"] == 1.7
    assert f["not_ready_s"] is None and f["ready_again_s"] is None
    assert f["errors"] == {"ClientPayloadError": 1, "ClientConnectorError": 2, "HTTP 503": 1}


def test_recovery_counts_only_requests_sent_after_the_last_failure() -> None:
    samples = [
        Sample(1.5, 1.9, None),
        Sample(2.0, 2.0, "ClientConnectorError: refused"),
        Sample(2.5, 3.0, None),
    ]
    f = figures(samples, 1.0)
    assert f["first_served_s"] == 0.9 and f["fail_window_s"] == 1.0 and f["recovered_s"] == 2.0


def test_each_fault_names_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--fault", "kill:decode"], ["--fault", "restart:unit"],
                 ["--fault", "restart:supervisord", "--serverurl", "unix:///x.sock"],
                 ["--fault", "kill:decoder", "--serverurl", "unix:///x.sock"]):  # fmt: skip
        assert faults.main(["--router", "http://127.0.0.1:1", *argv]) == 2
        assert "restart:unit with --unit" in capsys.readouterr().err


def test_any_program_of_group_pd_can_be_killed_by_name() -> None:
    for name in ("prefill", "decode-1", "aggregated-0", "aggregated-big", "router"):
        assert faults.PROGRAM.match(name), name
    for name in ("decoder", "monitor", "aggregated-", ""):
        assert not faults.PROGRAM.match(name), name


def test_restart_unit_stops_then_starts_the_unit_through_systemctl(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(faults.subprocess, "run", lambda argv, **_: calls.append(argv))
    faults.restart_unit("pd-appliance-supervisor")
    # stop runs the unit's ExecStop (pd:router first) and KillMode; nothing stops a program by hand.
    assert calls == [
        ["systemctl", "stop", "pd-appliance-supervisor"],
        ["systemctl", "start", "pd-appliance-supervisor"],
    ]
