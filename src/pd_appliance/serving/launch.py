"""Program launcher: what supervisor runs in front of the engine and the router.

    python -m pd_appliance.serving.launch --env-file F [--secret-arg --api-key=VAR]
        [--wait-for URL ...] [--wait-timeout-s N] -- COMMAND ...

- Reads KEY=value lines from the env file (0600, owned by the service user) into the environment,
  so secrets never appear in the supervisor config or its logs.
- `--secret-arg FLAG=VAR` gives `FLAG <value of VAR>` to programs that take a secret only as a flag
  (smg 1.13's and SGLang 0.5.23's --api-key have no environment variable or file option: read in
  smg/router_args.py and sglang/srt/server_args.py). Never on a command line, not even for a moment:
  both are Python programs, so the launcher execs their Python with a small shim that appends the
  flag to sys.argv inside the process and then runs the program (a console script by path, or
  `python -m module`); /proc/<pid>/cmdline shows the shim, not the secret. VAR leaves the environment
  before the program's own code runs. A wrapper the serving role renders in front of the program
  (`numactl <binding> -- PROGRAM ...`) is kept as is and the program after its `--` is rewritten: numactl
  execs it with the environment unchanged.
- `--wait-for URL` holds the start until every URL answers 2xx (the router waits for both workers'
  health), printing progress; on timeout it exits 1 and supervisor's backoff retries.
- Then it execs COMMAND, so supervisor signals (and stopasgroup kills) the real process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


class LaunchError(RuntimeError):
    """The launcher cannot start the program; the message says why and what to fix."""


def read_env_file(path: str) -> dict[str, str]:
    """KEY=value lines; blank lines and # comments skipped; the value is taken verbatim."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise LaunchError(
            f"cannot read env file {path}: {exc.strerror} (the serving role writes it)"
        ) from exc
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip().isidentifier():
            raise LaunchError(f"{path}:{number}: expected NAME=value")
        env[name.strip()] = value
    return env


# Runs inside the program's own interpreter: take the secret flags from the environment, append them to
# sys.argv, drop the variables, then run the program as its console script or `-m` module would.
IN_PROCESS_SHIM = (
    "import os, runpy, sys\n"
    "specs = os.environ.pop('PD_LAUNCH_SECRET_ARGS', '').split()\n"
    "kind, target = sys.argv[1], sys.argv[2]\n"
    "extra = []\n"
    "for spec in specs:\n"
    "    flag, _, var = spec.partition('=')\n"
    "    value = os.environ.pop(var, '')\n"
    "    if value:\n"
    "        extra += [flag, value]\n"
    "sys.argv = [target] + sys.argv[3:] + extra\n"
    "if kind == '-m':\n"
    "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n"
    "else:\n"
    "    runpy.run_path(target, run_name='__main__')\n"
)


def python_of(command: Sequence[str]) -> str | None:
    """The interpreter of a Python program: `python -m mod ...`, or a console script's shebang."""
    if len(command) >= 3 and command[1] == "-m" and "python" in Path(command[0]).name:
        return command[0]
    try:
        with Path(command[0]).open("rb") as handle:
            first = handle.readline(512)
    except OSError:
        return None
    if first.startswith(b"#!") and b"python" in first:
        return first[2:].decode().strip().split()[0]
    return None


# Programs the serving role puts in front of the engine; each ends its own options with `--`.
WRAPPERS = ("numactl",)


def split_wrapper(command: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the wrapper up to and with its `--`, the program it runs); no wrapper: ([], command)."""
    if command and Path(command[0]).name in WRAPPERS and "--" in command[1:]:
        end = list(command).index("--", 1) + 1
        return list(command[:end]), list(command[end:])
    return [], list(command)


def in_process_secrets(command: Sequence[str], specs: Sequence[str], env: dict[str, str]) -> list[str]:
    """Rewrite `command` so its Python receives the secret flags in-process (see IN_PROCESS_SHIM)."""
    wrapper, command = split_wrapper(command)
    if not command:
        raise LaunchError(f"{wrapper[0]} is given no program after its --")
    for spec in specs:
        flag, sep, var = spec.partition("=")
        if not sep or not flag.startswith("-") or not var:
            raise LaunchError(
                f"--secret-arg {spec!r}: expected FLAG=VARIABLE, e.g. --api-key=SERVING_API_KEY"
            )
    python = python_of(command)
    if python is None:
        raise LaunchError(
            f"{command[0]} is not a Python program (no python -m, no python shebang): a secret flag cannot "
            f"be handed to it without putting it on its command line"
        )
    env["PD_LAUNCH_SECRET_ARGS"] = " ".join(specs)
    if command[1:2] == ["-m"]:
        return [*wrapper, python, "-c", IN_PROCESS_SHIM, "-m", command[2], *command[3:]]
    return [*wrapper, python, "-c", IN_PROCESS_SHIM, "-path", str(command[0]), *command[1:]]


def _probe(url: str, timeout_s: float) -> str | None:
    """None when url answers 2xx, else a short reason."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return None if 200 <= response.status < 300 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def wait_for(
    urls: Sequence[str], timeout_s: float, interval_s: float = 1.0, log: Callable[[str], None] = print
) -> None:
    """Block until every URL answers 2xx; raise LaunchError naming the ones that never did."""
    pending = list(urls)
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    while pending:
        pending = [u for u in pending if _probe(u, min(5.0, max(0.5, interval_s * 5))) is not None]
        if not pending:
            break
        now = time.monotonic()
        if now >= deadline:
            reasons = ", ".join(f"{u} ({_probe(u, 2.0)})" for u in pending)
            raise LaunchError(f"gave up after {timeout_s:.0f}s waiting for {reasons}")
        if now - last_report >= 10:
            log(f"pd-launch: waiting for {', '.join(pending)} ({deadline - now:.0f}s left)")
            last_report = now
        time.sleep(interval_s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pd_appliance.serving.launch", description=__doc__.split("\n")[0]
    )
    p.add_argument("--env-file", action="append", default=[], help="KEY=value file(s) to load (repeatable)")
    p.add_argument("--secret-arg", action="append", default=[], metavar="FLAG=VAR")
    p.add_argument("--wait-for", action="append", default=[], metavar="URL")
    p.add_argument("--wait-timeout-s", type=float, default=3600.0)
    p.add_argument("--wait-interval-s", type=float, default=2.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def prepare(
    argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str], argparse.Namespace]:
    """Parse, load env files and secret flags; return (command argv, environment, options)."""
    args = build_parser().parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise LaunchError("no command given after --")
    env = dict(environ)
    for path in args.env_file:
        env.update(read_env_file(path))
    if args.secret_arg:
        command = in_process_secrets(command, args.secret_arg, env)
    return command, env, args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        command, env, args = prepare(sys.argv[1:] if argv is None else argv, os.environ)
        if args.wait_for:
            print(
                f"pd-launch: waiting for {', '.join(args.wait_for)} before starting {command[0]}", flush=True
            )
            wait_for(
                args.wait_for, args.wait_timeout_s, args.wait_interval_s, log=lambda m: print(m, flush=True)
            )
        sys.stdout.flush()
        os.execvpe(command[0], command, env)
    except LaunchError as exc:
        print(f"pd-launch: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:
        print(f"pd-launch: cannot execute {exc.filename or ''}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    return 0  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    raise SystemExit(main())
