"""python -m pd_appliance.sglang_args: SGLang's real parser and env registry, on the command line.

  venv                 build (or find) the parser venv; print its python
  check CONF... [-- ARGV]
                       parse every worker command of rendered supervisord conf files (and/or one
                       argv after --) with SGLang's own parser; exit 1 when it refuses any
  flags [--output F]   write the flag table (the rehearsal engine's package data,
                       standins/src/pd_standins/engine/sglang_flags.json)
  environ-names [--output F]
                       write the env registry (files/sglang/<version>/environ-names.json)
  env-check --registry F NAME...
                       check env hook names as preflight does; exit 1 on an unknown one

Where SGLang comes from: --python PY (a Python that imports the real sglang), else the parser
venv built from --wheel (default: $PD_SGLANG_WHEEL or the one sglang wheel in artifacts/wheels),
with the checkout's requirements list and patch series, cached under --cache-dir.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pd_appliance.sglang_args import derived, registry, rendered
from pd_appliance.sglang_args.parser_venv import ParserVenvError, ParserVenvInputs, ensure_parser_venv
from pd_appliance.sglang_args.real import RealSGLang, RealSGLangError, Verdict

# The checkout this module lives in (src/pd_appliance/sglang_args/cli.py), for the defaults.
CHECKOUT = Path(__file__).resolve().parents[3]
WHEEL_RE = re.compile(r"^sglang-(?P<version>[^-]+)-.*\.whl$")


def _default_wheel() -> Path | None:
    explicit = os.environ.get("PD_SGLANG_WHEEL")
    if explicit:
        return Path(explicit)
    found = sorted((CHECKOUT / "artifacts" / "wheels").glob("sglang-*.whl"))
    return found[0] if len(found) == 1 else None


def _real(args: argparse.Namespace) -> RealSGLang:
    if args.python:
        return RealSGLang(Path(args.python))
    return RealSGLang(_venv(args))


def _venv(args: argparse.Namespace) -> Path:
    wheel = Path(args.wheel) if args.wheel else _default_wheel()
    if wheel is None:
        raise ParserVenvError("no sglang wheel: pass --wheel or --python, or run `make wheels` first")
    match = WHEEL_RE.match(wheel.name)
    if not match:
        raise ParserVenvError(f"{wheel.name} is not named like an sglang wheel (sglang-<version>-...whl)")
    version = match["version"]
    inputs = ParserVenvInputs(
        wheel=wheel.resolve(),
        requirements=Path(args.requirements or CHECKOUT / f"files/sglang/{version}/parser-requirements.txt"),
        series_dir=Path(args.series or CHECKOUT / f"files/patches/sglang/{version}"),
        sglang_version=version,
    )

    def log(message: str) -> None:
        if not args.quiet:
            print(f"sglang-parser: {message}", file=sys.stderr, flush=True)

    return ensure_parser_venv(inputs, Path(args.cache_dir), log=log)


def check_conf_files(
    real: RealSGLang, confs: Sequence[str | Path], argv: Sequence[str] = ()
) -> list[tuple[str, Verdict]]:
    """SGLang's verdict on every worker command of rendered supervisord conf files (files with
    none, such as the router's, add nothing), and on `argv` when given. One SGLang process."""
    commands = [(c.label(), c.argv) for conf in confs for c in rendered.engine_commands(conf)]
    if argv:
        commands.append(("argv", list(argv)))
    verdicts = real.parse([words for _, words in commands]) if commands else []
    return [(label, verdict) for (label, _), verdict in zip(commands, verdicts, strict=True)]


def _check(args: argparse.Namespace) -> int:
    if not args.conf and not args.argv:
        print("nothing to check: give rendered conf files and/or an argv after --", file=sys.stderr)
        return 2
    results = check_conf_files(_real(args), args.conf, args.argv)
    if not results:
        print(f"no SGLang worker program in {' '.join(args.conf)}", file=sys.stderr)
        return 2
    refused = [(label, v) for label, v in results if not v.ok]
    for label, verdict in results:
        print(
            f"ok       {label}"
            if verdict.ok
            else f"REFUSED  {label}: exit {verdict.exit_code}: {verdict.message}"
        )
    print(f"SGLang's parser accepted {len(results) - len(refused)} of {len(results)} command line(s)")
    return 1 if refused else 0


def _write(document: dict[str, Any], output: str | None, default: str) -> int:
    path = Path(output) if output else CHECKOUT / default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(derived.dumps(document))
    print(f"wrote {path}")
    return 0


def _env_check(args: argparse.Namespace) -> int:
    errors = registry.env_name_errors(
        "env-check", {"argv": args.names}, registry.EnvRegistry.load(args.registry)
    )
    for error in errors:
        print(error)
    return 1 if errors else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pd_appliance.sglang_args",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = p.add_subparsers(dest="command", required=True)
    source = argparse.ArgumentParser(add_help=False)
    source.add_argument("--python", help="a Python that imports the real sglang (skips the venv)")
    source.add_argument("--wheel", help="the sglang wheel (default: $PD_SGLANG_WHEEL or artifacts/wheels)")
    source.add_argument("--requirements", help="default: files/sglang/<version>/parser-requirements.txt")
    source.add_argument("--series", help="patch series dir (default: files/patches/sglang/<version>)")
    source.add_argument("--cache-dir", default=str(CHECKOUT / "artifacts" / "sglang-parser"))
    source.add_argument("-q", "--quiet", action="store_true")
    sub.add_parser("venv", parents=[source], help="build or find the parser venv; print its python")
    check = sub.add_parser("check", parents=[source], help="parse rendered worker commands with SGLang")
    check.add_argument(
        "conf", nargs="*", help="rendered supervisord conf file(s); then `-- ARGV` for one argv"
    )
    for name, what in (("flags", "SGLang's flag table"), ("environ-names", "SGLang's env registry")):
        gen = sub.add_parser(name, parents=[source], help=f"write {what}")
        gen.add_argument("--output", help="default: where the checkout keeps it")
    env = sub.add_parser("env-check", help="check env hook names against a registry file")
    env.add_argument("--registry", required=True, help="files/sglang/<version>/environ-names.json")
    env.add_argument("names", nargs="+")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in words:  # `check [CONF...] -- ARGV`: everything after -- is one SGLang argv
        split = words.index("--")
        words, extra = words[:split], words[split + 1 :]
    args = build_parser().parse_args(words)
    args.argv = extra
    try:
        if args.command == "venv":
            print(_venv(args))
            return 0
        if args.command == "check":
            return _check(args)
        if args.command == "flags":
            return _write(derived.flag_table_document(_real(args)), args.output, derived.FLAG_TABLE_PATH)
        if args.command == "environ-names":
            series = Path(args.series) if args.series else None
            document = derived.environ_names_document(_real(args), CHECKOUT, series)
            default = derived.ENVIRON_NAMES_PATH.format(version=document["sglang_version"])
            return _write(document, args.output, default)
        return _env_check(args)
    except (
        OSError,
        ParserVenvError,
        RealSGLangError,
        registry.RegistryError,
        rendered.RenderedCommandError,
    ) as exc:
        print(f"pd_appliance.sglang_args: {exc}", file=sys.stderr)
        return 1
