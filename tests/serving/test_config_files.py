"""plugins/modules/pd_config_files through ansible: many directories and files in one module run."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pd_testlib import run_module as run_ansible_module


def run_module(args: dict, *flags: str) -> dict:
    """One pd_config_files run (the module needs nothing beyond ansible.module_utils)."""
    return run_ansible_module("pd_config_files", args, *flags)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def layout(tmp_path: Path, env_line: str) -> dict:
    who = {"owner": str(os.getuid()), "group": str(os.getgid())}
    return {
        "directories": [
            {"path": str(tmp_path / "etc/pd/conf.d"), "mode": "0750", **who},
            {"path": str(tmp_path / "etc/pd/env"), "mode": "0700", **who},
        ],
        "files": [
            {"path": str(tmp_path / "etc/pd/conf.d/decode.conf"), "content": "[program:decode]\n",
             "mode": "0640", "name": "decode", **who},
            {"path": str(tmp_path / "etc/pd/env/decode.env"), "content": env_line, "mode": "0600",
             "name": "decode-env", **who},
        ],
    }  # fmt: skip


def test_creates_then_changes_nothing_then_only_what_differs(tmp_path: Path) -> None:
    first = run_module(layout(tmp_path, "KEY=1\n"))
    assert first["changed"] and first["changed_names"] == ["decode", "decode-env"], first
    # Parents it made carry the entry's attributes, as ansible.builtin.file gives them.
    assert mode(tmp_path / "etc") == 0o750 and mode(tmp_path / "etc/pd/conf.d") == 0o750
    assert mode(tmp_path / "etc/pd/env") == 0o700 and mode(tmp_path / "etc/pd/env/decode.env") == 0o600
    assert (tmp_path / "etc/pd/conf.d/decode.conf").read_text() == "[program:decode]\n"

    again = run_module(layout(tmp_path, "KEY=1\n"))
    assert not again["changed"] and again["changed_names"] == [] and again["changed_paths"] == [], again

    (tmp_path / "etc/pd/conf.d/decode.conf").chmod(0o644)  # attributes drifted: put back, reported
    edited = run_module(layout(tmp_path, "KEY=2\n"))
    assert edited["changed_names"] == ["decode", "decode-env"], edited
    assert mode(tmp_path / "etc/pd/conf.d/decode.conf") == 0o640
    assert (tmp_path / "etc/pd/env/decode.env").read_text() == "KEY=2\n"
    assert not [p for p in (tmp_path / "etc/pd/env").iterdir() if p.name.startswith(".")], (
        "temporary file left"
    )


def test_check_mode_reports_and_writes_nothing(tmp_path: Path) -> None:
    checked = run_module(layout(tmp_path, "KEY=1\n"), "--check", "--diff")
    assert checked["changed"] and checked["changed_names"] == ["decode", "decode-env"], checked
    assert not (tmp_path / "etc").exists()
    assert len(checked["changed_paths"]) == 4, checked  # two directories, two files


def test_absent_removes_files_and_a_missing_directory_is_named(tmp_path: Path) -> None:
    run_module(layout(tmp_path, "KEY=1\n"))
    stale = tmp_path / "etc/pd/conf.d/decode-1.conf"
    stale.write_text("old\n")
    removed = run_module({"absent": [str(stale), str(tmp_path / "never-there")]})
    assert removed["changed_paths"] == [str(stale)] and not stale.exists(), removed

    orphan = {"files": [{"path": str(tmp_path / "nowhere/x.conf"), "content": "x\n"}]}
    failed = run_module(orphan)
    assert failed["failed"] and "does not exist: list it in directories" in failed["msg"], failed


def test_validate_keeps_the_old_file_when_the_new_content_is_refused(tmp_path: Path) -> None:
    """As template's validate: the command sees the new content (%s, a file beside the path) and the
    old file stays when it exits non-zero; monitoring's rules and Prometheus config rely on it."""
    target = tmp_path / "rules.yml"
    target.write_text("good: 1\n")
    entry = {"path": str(target), "mode": "0640", "validate": "grep -q good %s"}
    refused = run_module({"files": [entry | {"content": "bad: 1\n"}]})
    assert refused["failed"] and "was not changed" in refused["msg"], refused
    assert target.read_text() == "good: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rules.yml"], "no temporary file is left behind"
    accepted = run_module({"files": [entry | {"content": "good: 2\n"}]})
    assert accepted["changed"] and target.read_text() == "good: 2\n", accepted
    unchanged = run_module({"files": [entry | {"content": "good: 2\n", "validate": "false %s"}]})
    assert not unchanged["failed"] and not unchanged["changed"], "an unchanged file is not validated again"
