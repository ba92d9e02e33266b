"""pd_appliance.serving.polling: the one loop every serving wait runs (a fake clock, no real sleep)."""

from __future__ import annotations

import pytest

from pd_appliance.release.errors import ReleaseError
from pd_appliance.release.rollout import wait_healthy
from pd_appliance.serving.polling import poll


class FakeClock:
    """A clock that advances only when the loop sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_it_stops_at_the_first_settled_look() -> None:
    clock = FakeClock()
    looks = iter([1, 2, 3, 4])
    polled = poll(lambda: next(looks), lambda seen: seen == 3, 60, 2, clock, clock.sleep)
    assert (polled.seen, polled.settled, polled.waited_s) == (3, True, 4.0)
    assert clock.sleeps == [2, 2]


def test_it_stops_at_the_deadline_with_the_last_look_unsettled() -> None:
    clock = FakeClock()
    count = iter(range(100))
    polled = poll(lambda: next(count), lambda seen: False, 5, 2, clock, clock.sleep)
    assert (polled.seen, polled.settled, polled.waited_s) == (3, False, 6.0)


def test_a_zero_timeout_looks_once() -> None:
    clock = FakeClock()
    polled = poll(lambda: "x", lambda seen: False, 0, 2, clock, clock.sleep)
    assert (polled.seen, polled.settled, clock.sleeps) == ("x", False, [])


class FakeSupervisor:
    """supervisor's XML-RPC getProcessInfo, answering a scripted sequence of states."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.supervisor = self

    def getProcessInfo(self, name: str) -> dict[str, str]:
        return {"statename": self.states.pop(0) if len(self.states) > 1 else self.states[0]}


def test_a_release_restart_waits_for_running_and_2xx_and_names_a_crash() -> None:

    statuses = iter([503, 204])
    took = wait_healthy(
        FakeSupervisor(["STARTING", "RUNNING"]),
        "pd:decode",
        "http://x/health",
        5,
        0.01,
        lambda url: next(statuses),
    )
    assert 0 < took < 5
    with pytest.raises(ReleaseError, match="pd:decode went BACKOFF"):
        wait_healthy(
            FakeSupervisor(["STARTING", "BACKOFF"]), "pd:decode", "http://x/health", 5, 0.01, lambda url: 200
        )
    with pytest.raises(ReleaseError, match="did not answer http://x/health within 0 s"):
        wait_healthy(FakeSupervisor(["RUNNING"]), "pd:decode", "http://x/health", 0.05, 0.01, lambda url: 503)
