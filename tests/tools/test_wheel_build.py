"""pd_appliance.supply.wheel_build: builds side by side on one checkout never leave the shared
directory without its wheel (molecule's default and multinode scenarios raced on it in CI)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from pd_appliance.supply import wheel_build

# Stands in for `python -m pip wheel ... -w DIR SOURCE`: writes the wheel slowly into DIR.
FAKE_PIP = """
import sys, time
out = sys.argv[sys.argv.index("-w") + 1]
time.sleep(0.3)
with open(out + "/pd_appliance-0.1.0-py3-none-any.whl", "wb") as handle:
    handle.write(b"reproducible bytes")
"""


def test_side_by_side_builds_leave_one_wheel_and_no_scratch(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n" + FAKE_PIP)
    python.chmod(0o755)
    out = tmp_path / "build"
    out.mkdir()
    (out / "pd_appliance-0.0.9-py3-none-any.whl").write_bytes(b"old")
    seen: list[list[str]] = []
    done = threading.Event()

    def watch() -> None:  # what a copy in another play would find meanwhile
        while not done.is_set():
            seen.append(sorted(p.name for p in out.glob("pd_appliance-*.whl")))

    watcher = threading.Thread(target=watch)
    watcher.start()
    builds = [
        threading.Thread(target=wheel_build.build, args=(tmp_path, out, True, str(python))) for _ in range(2)
    ]
    for b in builds:
        b.start()
    for b in builds:
        b.join()
    done.set()
    watcher.join()
    assert sorted(p.name for p in out.iterdir()) == ["pd_appliance-0.1.0-py3-none-any.whl"]
    assert (out / "pd_appliance-0.1.0-py3-none-any.whl").read_bytes() == b"reproducible bytes"
    assert all(names for names in seen), "the shared directory was seen without a wheel"
