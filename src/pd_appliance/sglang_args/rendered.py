"""Rendered supervisord programs read back into the argv that SGLang's parser receives.

A worker's `command=` is, in order: the launcher (`<tools python> -m pd_appliance.serving.launch
--env-file=... [--secret-arg=FLAG=VAR ...] --`), optionally numactl (`numactl <binding> --`),
the engine command (`<sglang python> -m sglang.launch_server`, `sglang serve`, or the rehearsal
engine `pd-sim-worker`) and then SGLang's flags. The launcher appends each secret flag at start
from its env file; it is added here with a placeholder value, so the parser sees the same words.
"""

from __future__ import annotations

import configparser
import os
import shlex
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pd_appliance.serving import launch

LAUNCHER_MODULE = "pd_appliance.serving.launch"
SGLANG_MODULES = ("sglang.launch_server",)
REHEARSAL_ENGINES = ("pd-sim-worker",)
SECRET_PLACEHOLDER = "<secret from {var}>"


class RenderedCommandError(ValueError):
    """A command line that is not a worker command this module understands."""


@dataclass(frozen=True)
class EngineCommand:
    """One rendered worker: where it came from, its engine command and SGLang's argv."""

    source: str
    program: str
    engine: list[str]
    argv: list[str]

    def label(self) -> str:
        return f"{self.source} [program:{self.program}]"


def _after_separator(words: list[str], what: str) -> list[str]:
    if "--" not in words:
        raise RenderedCommandError(f"{what} has no '--' before the command it runs: {shlex.join(words)}")
    return words[words.index("--") + 1 :]


def _strip_launcher(words: list[str]) -> tuple[list[str], list[str]]:
    """(command after the launcher, secret flags the launcher adds), or the words unchanged."""
    if words[1:3] != ["-m", LAUNCHER_MODULE]:
        return words, []
    options = launch.build_parser().parse_args(words[3:])
    command = list(options.command)
    if command[:1] == ["--"]:
        command = command[1:]
    secrets: list[str] = []
    for spec in options.secret_arg:
        flag, _, var = spec.partition("=")
        secrets += [flag, SECRET_PLACEHOLDER.format(var=var)]
    return command, secrets


def split_engine_argv(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """(engine command, SGLang argv) of a rendered worker command line."""
    words = list(words)
    if not words:
        raise RenderedCommandError("empty command")
    command, secrets = _strip_launcher(words)
    if command and os.path.basename(command[0]) == "numactl":
        command = _after_separator(command, "numactl")
    if len(command) >= 3 and command[1] == "-m" and command[2] in SGLANG_MODULES:
        engine, argv = command[:3], command[3:]
    elif len(command) >= 2 and os.path.basename(command[0]) == "sglang" and command[1] == "serve":
        engine, argv = command[:2], command[2:]
    elif command and os.path.basename(command[0]) in REHEARSAL_ENGINES:
        # The rehearsal engine's own knobs (--sim-*, exact names) come first and are not SGLang's flags.
        end = 1
        while end < len(command) and command[end].startswith("--sim-"):
            end += 1
        engine, argv = command[:end], command[end:]
    else:
        raise RenderedCommandError(
            "no SGLang engine command (python -m sglang.launch_server, sglang serve or pd-sim-worker) "
            f"in: {shlex.join(words)}"
        )
    return engine, argv + secrets


def _expand(value: str, conf: Path, program: str) -> str:
    """supervisord's %-expansion of command= (supervisor/options.py: here, program_name, ENV_*)."""
    names = {
        "here": str(conf.parent.resolve()),
        "program_name": program,
        "group_name": program,
        "process_num": 0,
        "host_node_name": socket.gethostname(),
        **{f"ENV_{k}": v for k, v in os.environ.items()},
    }
    try:
        return value % names
    except (KeyError, ValueError) as exc:
        raise RenderedCommandError(f"{conf} [program:{program}]: bad %-expansion ({exc})") from exc


def engine_commands(conf: str | Path) -> list[EngineCommand]:
    """Every SGLang worker program of a supervisord conf file (router and others are skipped)."""
    conf = Path(conf)
    parser = configparser.RawConfigParser(inline_comment_prefixes=None, strict=False)
    parser.read_string(conf.read_text(), source=str(conf))
    out = []
    for section in parser.sections():
        if not section.startswith("program:") or not parser.has_option(section, "command"):
            continue
        program = section.split(":", 1)[1]
        words = shlex.split(_expand(parser.get(section, "command"), conf, program), comments=False)
        try:
            engine, argv = split_engine_argv(words)
        except RenderedCommandError:
            continue  # not a worker (the router's smg, ...)
        out.append(EngineCommand(source=str(conf), program=program, engine=engine, argv=argv))
    return out
