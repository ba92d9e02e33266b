"""Patch 0003 on the real wheel: the server_args INFO line carries no API key.

SGLang 0.5.23 logs `server_args={_server_args_for_logging(server_args)}` at start-up; the workers
get --api-key, so without the patch the router's key lands in every worker log. The patched
function is taken from the patched engine.py and run on a stand-in ServerArgs (importing the
whole engine module needs CUDA)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from sglang_testlib import apply_to_site

ENGINE = "sglang/srt/entrypoints/engine.py"


class _ServerArgs:
    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def resolved_dict(self) -> dict[str, Any]:
        return dict(self.values)


def _patched_logging_function(engine_py: Path) -> Any:
    """_LOGGED_SECRET_ARGS and _server_args_for_logging from the file, compiled alone."""
    tree = ast.parse(engine_py.read_text(encoding="utf-8"))
    wanted = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name == "_server_args_for_logging")
        or (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "_LOGGED_SECRET_ARGS" for t in node.targets)
        )
    ]
    assert len(wanted) == 2, "patch 0003 defines _LOGGED_SECRET_ARGS and patches _server_args_for_logging"
    namespace: dict[str, Any] = {"redact_watermark_secrets": lambda value: value, "ServerArgs": object}
    namespace.update({"Dict": dict, "Any": Any})
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(engine_py), "exec"), namespace)
    return namespace["_server_args_for_logging"]


def test_the_server_args_line_redacts_both_api_keys(site_packages: Path) -> None:
    apply_to_site(site_packages)
    log_args = _patched_logging_function(site_packages / ENGINE)
    values = {"api_key": "router-secret", "admin_api_key": "admin-secret", "tp_size": 4, "port": 30001}
    logged = log_args(_ServerArgs(values))
    assert logged == {"api_key": "<redacted>", "admin_api_key": "<redacted>", "tp_size": 4, "port": 30001}
    assert "router-secret" not in f"server_args={logged}"
    assert log_args(_ServerArgs({"api_key": None, "tp_size": 4})) == {"api_key": None, "tp_size": 4}


def test_the_unpatched_wheel_logs_the_key(site_packages: Path) -> None:
    """Why the patch exists: the pristine function has no such redaction."""
    text = (site_packages / ENGINE).read_text(encoding="utf-8")
    assert "return redact_watermark_secrets(server_args.resolved_dict())" in text
    assert "_LOGGED_SECRET_ARGS" not in text
