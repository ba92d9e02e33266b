"""Why a configuration did not come up: the programs to blame, with their log tails (serving.tails)."""

from __future__ import annotations

import json
import subprocess
import sys

from pd_appliance.serving import tails

HEALTH = {"prefill": "http://p/health", "decode": "http://d/health", "router": "http://r/readiness"}


def _read(states: dict[str, str], healthy: set[str]) -> dict:
    return tails.read(
        HEALTH,
        lambda name: (states[name], f"{name} says"),
        lambda url: {"ok": url in {HEALTH[n] for n in healthy}},
        lambda name: f"tail of {name}\n",
    )


def test_a_crash_loop_blames_the_workers_not_the_router_waiting_for_them() -> None:
    # Caught between supervisor's startsecs and its next crash, a crash-looping worker reads RUNNING.
    seen = _read({"prefill": "RUNNING", "decode": "BACKOFF", "router": "RUNNING"}, set())
    assert seen["down"] == ["prefill", "decode"]
    assert seen["programs"]["prefill"]["log_tail"] == "tail of prefill\n"
    assert "log_tail" not in seen["programs"]["router"] and seen["programs"]["router"]["up"] is False
    assert _read({"prefill": "FATAL", "decode": "RUNNING", "router": "FATAL"}, {"decode"})["down"] == [
        "prefill", "router"]  # fmt: skip


def test_a_router_that_is_not_ready_with_every_worker_up_is_blamed() -> None:
    seen = _read({"prefill": "RUNNING", "decode": "RUNNING", "router": "RUNNING"}, {"prefill", "decode"})
    assert seen["down"] == ["router"] and seen["programs"]["prefill"]["up"] is True
    assert _read({"prefill": "RUNNING", "decode": "RUNNING", "router": "RUNNING"}, set(HEALTH))["down"] == []


def test_the_command_reports_an_unreachable_supervisor_as_unknown(tmp_path) -> None:
    (tmp_path / "decode.log").write_text("".join(f"{i}\n" for i in range(10)))
    result = subprocess.run(
        [sys.executable, "-m", "pd_appliance.serving.tails", f"--serverurl=unix://{tmp_path}/none.sock",
         f"--log-dir={tmp_path}", "--lines=3", "--health=decode=http://127.0.0.1:9/health"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    seen = json.loads(result.stdout)
    assert seen["down"] == ["decode"] and seen["programs"]["decode"]["state"] == "UNKNOWN"
    assert seen["programs"]["decode"]["log_tail"] == "7\n8\n9\n"
