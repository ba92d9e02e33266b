"""plugins/modules/pd_host_read through ansible: a role's reads of the host in one module run.

The roles judge what it returns as they judged command, slurp and stat: a command that fails is a
result (its rc), a missing file has no content, a missing path does not exist. Each shape is held
here to the builtin module it replaces, on the host's own Python (as a lab host runs it).
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from pd_testlib import run_module


def test_commands_files_stats_hashes_and_listings_in_one_run(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    pidfile = tmp_path / "dir/supervisord.pid"
    pidfile.write_text("4242\n")
    tool = tmp_path / "dir/tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o750)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    result = run_module(
        "pd_host_read",
        {
            "commands": {
                "ok": ["sh", "-c", 'printf "a\\nb\\n"; echo oops >&2'],
                "fails": ["sh", "-c", "exit 3"],
                "missing": [str(tmp_path / "no-such-program")],
                "dollar": ["sh", "-c", 'echo "$1"', "sh", "$HOME"],
            },
            "files": {"pid": str(pidfile), "absent": str(tmp_path / "absent")},
            "stats": {
                "tool": str(tool),
                "absent": str(tmp_path / "absent"),
                "dangling": str(tmp_path / "dangling"),
            },
            "sha256": {"tool": str(tool), "absent": str(tmp_path / "absent")},
            "directories": {"dir": str(tmp_path / "dir"), "absent": str(tmp_path / "absent")},
        },
    )
    assert not result["failed"] and not result["changed"], result
    commands = result["commands"]
    # command's shape: trailing newline gone, stdout_lines split, rc kept (failed_when: false).
    assert commands["ok"] == {"rc": 0, "stdout": "a\nb", "stderr": "oops", "stdout_lines": ["a", "b"]}
    assert commands["fails"]["rc"] == 3
    assert commands["missing"]["rc"] == 127 and "No such file" in commands["missing"]["stderr"]
    # Arguments are passed as given: no shell, no expansion of $HOME by the module.
    assert commands["dollar"]["stdout"] == "$HOME"
    # slurp's shape: content base64; a missing file has none.
    assert base64.b64decode(result["files"]["pid"]["content"]).decode() == "4242\n"
    assert "content" not in result["files"]["absent"]
    tool_stat = result["stats"]["tool"]["stat"]
    assert tool_stat["exists"] and tool_stat["isreg"] and tool_stat["executable"]
    assert tool_stat["mode"] == "0750"
    assert tool_stat["uid"] == os.getuid() and tool_stat["pw_name"]
    assert result["stats"]["absent"] == {"stat": {"exists": False}}
    assert result["stats"]["dangling"]["stat"]["exists"] and result["stats"]["dangling"]["stat"]["islnk"]
    assert result["sha256"] == {"tool": hashlib.sha256(b"#!/bin/sh\n").hexdigest(), "absent": None}
    assert result["directories"] == {"dir": ["supervisord.pid", "tool"], "absent": None}


def test_it_reads_in_check_mode_and_refuses_a_command_that_is_not_an_argv(tmp_path: Path) -> None:
    checked = run_module("pd_host_read", {"commands": {"echo": ["echo", "hi"]}}, "--check")
    assert not checked["failed"] and checked["commands"]["echo"]["stdout"] == "hi", checked
    refused = run_module("pd_host_read", {"commands": {"shell": "echo hi"}})
    assert refused["failed"] and "non-empty argv list" in refused["msg"], refused
