"""The release rehearsal's steps do not cascade (release_testlib.act/arrive), shown on a scripted lab
in milliseconds: a passing run replays nothing, a step whose play failed is replayed once by the next
step, a step that failed only in its assertions leaves its state to the next step, and each step asks
for its release from the initial variables, not from what the step before left behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from release_testlib import Lab, act, arrive


class ScriptedLab(Lab):
    """A Lab whose plays only write the release state: succeed unless `failing` names the step's
    release (or it is step 3's gate, which fails and leaves the current release in place)."""

    def __init__(self, base: Path, failing: set[int] | None = None) -> None:
        assets = SimpleNamespace(lock_standin="L", series_standin="S", series_changed="C")
        initial = {"appliance_root": str(base / "root"), "sglang_patch_series_dir": "R"}
        super().__init__(base=base, assets=assets, hub=None, inventory=base, variables=dict(initial),
                         ports={}, initial=initial)  # fmt: skip
        self.failing = failing or set()
        self.calls: list[dict[str, Any]] = []
        self.file = base / "root/var/lib/pd-appliance/releases/state.json"
        self.file.parent.mkdir(parents=True)
        self.file.write_text(json.dumps({"current": None, "releases": {}}))

    def _step(self) -> int:
        v = self.variables
        if "serving_env_decode" in v:
            return 3
        return {"R": 1, "C": 2, "S": 4}[v["sglang_patch_series_dir"]]

    def play(self, tags: str, *extra: str, **_: Any) -> subprocess.CompletedProcess:
        self.calls.append(dict(self.variables))
        state, step = json.loads(self.file.read_text()), self._step()
        rid = f"r-{len(self.calls)}"
        ok = step != 3 and step not in self.failing
        state["releases"][rid] = {"status": "accepted" if ok else "failed"}
        if ok:
            state["current"] = rid
        self.file.write_text(json.dumps(state))
        return subprocess.CompletedProcess([], 0 if ok else 2, "", "")

    def cli(self, *args: str, **_: Any) -> subprocess.CompletedProcess:
        self.calls.append({"cli": args})
        state = json.loads(self.file.read_text())
        state["current"] = [r for r, v in state["releases"].items() if v["status"] == "accepted"][-2]
        self.file.write_text(json.dumps(state))
        return subprocess.CompletedProcess([], 0, "", "")


def test_a_passing_run_replays_nothing(tmp_path: Path) -> None:
    lab = ScriptedLab(tmp_path)
    for step in range(1, 6):
        arrive(lab, step)
        act(lab, step)
    assert len(lab.calls) == 5 and sorted(lab.reached) == [1, 2, 3, 4, 5]
    arrive(lab, 6)
    assert len(lab.calls) == 5


def test_a_step_whose_play_failed_is_replayed_once_by_the_next(tmp_path: Path) -> None:
    lab = ScriptedLab(tmp_path, failing={2})
    act(lab, 1)
    assert act(lab, 2).returncode != 0 and 2 not in lab.reached
    lab.failing.clear()  # the failure was the machine's, not the release's
    arrive(lab, 3)
    assert len(lab.calls) == 3 and lab.reached[2] == "r-3"


def test_a_step_that_cannot_be_reached_fails_the_next_steps_at_once(tmp_path: Path) -> None:
    lab = ScriptedLab(tmp_path, failing={1})
    act(lab, 1)
    with pytest.raises(pytest.fail.Exception, match="step 2 cannot start: step 1's action, replayed"):
        arrive(lab, 2)
    with pytest.raises(pytest.fail.Exception, match="step 3 cannot start: step 1's action failed, also when"):
        arrive(lab, 3)
    assert len(lab.calls) == 2, "replayed once, not once per later step"


def test_each_step_asks_for_its_release_from_the_initial_variables(tmp_path: Path) -> None:
    lab = ScriptedLab(tmp_path)
    arrive(lab, 4)  # steps 1-3 replayed: step 3's gate fails as it should and is recorded
    assert lab.reached[3] == "r-3" and lab.reached[2] == "r-2"
    act(lab, 4)
    assert "serving_env_decode" not in lab.calls[-1], "step 3's decode hook is not carried into step 4"
    assert lab.calls[-1]["sglang_patch_series_dir"] == "S"
