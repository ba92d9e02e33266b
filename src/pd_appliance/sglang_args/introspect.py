"""Runs inside a venv that holds the real (patched) SGLang wheel: its parser and its env registry.

Called as `python -m pd_appliance.sglang_args.introspect OP OUT` with a JSON request on stdin;
the JSON answer goes to the file OUT, because SGLang's imports may print to stdout.

- parse: each argv through `sglang.srt.server_args.prepare_server_args`, the function
  `python -m sglang.launch_server` and `sglang serve` call on sys.argv[1:]; argparse's refusal
  (exit status 2 and its message) or any other error is reported, not raised.
- flags: the parser prepare_server_args builds (caught as it parses), described as data:
  option strings, dest, nargs, type name, choices, required. Enough for another argparse
  parser to accept and refuse the same command lines (the rehearsal engine's flag table).
- environ-names: the fields of `sglang.srt.environ.Envs`, its deprecated names with SGLang's
  advice, and the SGLANG_* names SGLang's code reads straight from os.environ.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# An SGLANG_* literal as an env read: reader(NAME...), environ[NAME], NAME in environ.
_NAME = rb"""["'](SGLANG_[A-Z0-9_]+)["']"""
_ENV_READ = re.compile(
    rb"|".join(
        [
            rb"(?:environ\.get|getenv|environ\.pop|environ\.setdefault|_env_var)\(\s*" + _NAME,
            rb"environ\[\s*" + _NAME + rb"\s*\]",
            _NAME + rb"\s+(?:not\s+)?in\s+(?:os\.)?environ\b",
        ]
    )
)
# Packages of the wheel that `python -m sglang.launch_server` never loads, or that are tests.
_SKIP_PARTS = {"test", "tests", "multimodal_gen", "benchmark", "__pycache__"}


def parse(argv: Sequence[str], fields: Sequence[str] = ()) -> dict[str, Any]:
    """SGLang's verdict on one argv: ok, exit status (argparse: 2), what it printed, and the
    values it parsed for `fields` (ServerArgs attribute names) when it accepted the argv."""
    from sglang.srt.server_args import prepare_server_args

    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(printed):
            server_args = prepare_server_args(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        return {
            "ok": code == 0,
            "exit_code": code,
            "message": _without_usage(printed.getvalue()),
            "values": {},
        }
    except Exception as exc:  # anything prepare_server_args raises is a refusal too
        return {"ok": False, "exit_code": None, "message": f"{type(exc).__name__}: {exc}", "values": {}}
    values = {f: _plain(getattr(server_args, f, None)) for f in fields}
    return {"ok": True, "exit_code": 0, "message": _without_usage(printed.getvalue()), "values": values}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _without_usage(text: str) -> str:
    """What argparse printed, less its usage block (500 flags long for SGLang)."""
    lines = text.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if ": error: " in line]
    return "\n".join(lines[errors[0] :] if errors else lines[-20:])


def real_parser() -> argparse.ArgumentParser:
    """The ArgumentParser that prepare_server_args builds and parses with, caught in the act."""
    from sglang.srt.server_args import prepare_server_args

    caught: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def spy(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        caught.append(self)
        return original(self, *args, **kwargs)

    argparse.ArgumentParser.parse_args = spy  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            prepare_server_args(["--model-path", "pd-appliance-probe"])
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    if not caught:
        raise RuntimeError("prepare_server_args parsed nothing through argparse: the parser moved")
    return caught[0]


def _type_name(action: argparse.Action) -> str | None:
    if action.type is None:
        return None if action.nargs == 0 else "str"
    return getattr(action.type, "__name__", type(action.type).__name__)


def _choices(action: argparse.Action) -> list[Any] | None:
    if action.choices is None:
        return None
    values = [c if isinstance(c, (str, int, float, bool)) else str(c) for c in action.choices]
    if isinstance(action.choices, (set, frozenset)):
        values.sort(key=str)
    return values


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse._HelpAction):
        return "help"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    return "flag" if action.nargs == 0 else "value"


def flag_table() -> dict[str, Any]:
    """SGLang's command-line surface as data (see the module doc)."""
    from importlib.metadata import version

    parser = real_parser()
    flags = []
    for action in parser._actions:
        if not action.option_strings:
            raise RuntimeError(f"SGLang's parser has a positional argument {action.dest!r}; describe it")
        flags.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "kind": _kind(action),
                "nargs": action.nargs,
                "type": _type_name(action),
                "choices": _choices(action),
                "required": bool(action.required),
            }
        )
    return {
        "sglang_version": version("sglang"),
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "prefix_chars": parser.prefix_chars,
        "mutually_exclusive": [[a.dest for a in g._group_actions] for g in parser._mutually_exclusive_groups],
        "flags": flags,
    }


def names_read_directly(package: Path) -> set[str]:
    """SGLANG_* names SGLang's code reads from os.environ itself, outside the Envs registry: the
    first argument of an env reader call (os.environ.get, os.getenv, get_bool_env_var, ...),
    os.environ[...] and `... in os.environ`. A regular expression over the source: parsing all of
    the wheel's 4,700 modules with ast takes 20 s, this takes one."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        if _SKIP_PARTS.isdisjoint(path.relative_to(package).parts):
            for match in _ENV_READ.finditer(path.read_bytes()):
                found.add(next(g for g in match.groups() if g).decode())
    return found


def environ_names() -> dict[str, Any]:
    """SGLang's env registry: Envs fields, deprecated names, and names read directly."""
    from importlib.metadata import version

    from sglang.srt import environ

    import sglang

    fields = {v.name: v for v in vars(environ.Envs).values() if isinstance(v, environ.EnvField)}
    deprecated: dict[str, str] = {}
    for name, value in fields.items():
        old = getattr(value, "deprecated_name", None)
        if old:
            deprecated[old] = f"SGLang reads it only as a fallback for {name}: use {name}"
    for old, entry in getattr(environ, "_DEPRECATED_ENVS", {}).items():
        advice = [f"use {entry.replacement}"] if getattr(entry, "replacement", None) else []
        if getattr(entry, "note", None):
            advice.append(entry.note)
        deprecated[old] = "; ".join(advice) or "SGLang ignores it (removed without replacement)"
    direct = names_read_directly(Path(sglang.__file__).parent) - set(fields) - set(deprecated)
    return {
        "sglang_version": version("sglang"),
        "names": sorted(fields),
        "deprecated": dict(sorted(deprecated.items())),
        "read_directly": sorted(direct),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in ("parse", "flags", "environ-names"):
        print("usage: introspect.py {parse|flags|environ-names} OUT", file=sys.stderr)
        return 2
    op, out = args
    # Dynamic choices read SGLANG_* variables (e.g. --sampling-backend): answer for a clean env.
    for key in [k for k in os.environ if k.startswith(("SGLANG_", "SGL_"))]:
        del os.environ[key]
    if op == "parse":
        request = json.load(sys.stdin)
        answer: Any = [parse(argv, request.get("fields", ())) for argv in request["argvs"]]
    elif op == "flags":
        answer = flag_table()
    else:
        answer = environ_names()
    Path(out).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
