"""pd-sim-worker: start a simulated SGLang worker (the rehearsal engine).

It takes the same command line as `python -m sglang.launch_server` and refuses what SGLang 0.5.23
refuses: an unknown or misspelt flag, a value outside a flag's choices, a missing value or
required flag, a bad number. Refusals exit with status 2 and argparse's message naming the flag,
as SGLang's parser does. The flags come from sglang_flags.json (package data: SGLang's flags as
data, derived from its real parser by `python -m pd_appliance.sglang_args flags`; CI regenerates
it from the wheel and fails on drift), so the parser here is shaped like SGLang's: the same option
strings, arities, choices and abbreviations. The flags the simulation uses are honoured; the
others are accepted and listed once at start-up.

Simulator knobs are --sim-* flags (exact names only, taken out before SGLang's flags are parsed)
or PD_SIM_* environment variables (env hooks set the latter, so the rehearsal needs no extra flags).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from pd_standins.engine import SIMULATOR_BANNER, model_checks, startup, startup_log
from pd_standins.engine.bootstrap import PdTimeouts
from pd_standins.engine.host_contract import HostContractError
from pd_standins.engine.kv_pool import UNSIZED_MAX_RUNNING_REQUESTS
from pd_standins.engine.launch_checks import LaunchRefused
from pd_standins.engine.server import SimConfig, serve
from pd_standins.engine.text import CannedCompletions, CannedCompletionsError

log = logging.getLogger("pd_sim_worker")

PROG = "pd-sim-worker"
FLAG_TABLE = "sglang_flags.json"
# SGLang flags the simulation reads (by argparse dest) -> the default when absent. The defaults
# are SGLang's (tests/sglang/test_server_args.py checks them against the real parser), except
# context_length and max_running_requests, which SGLang derives from the model and the GPU.
HONOURED: dict[str, Any] = {
    "model_path": None,
    "served_model_name": None,
    "tp_size": 1,
    "host": "127.0.0.1",
    "port": 30000,
    "disaggregation_mode": "null",
    "disaggregation_bootstrap_port": 8998,
    "api_key": None,
    "context_length": 65536,
    "max_running_requests": 256,
    "enable_metrics": False,
}
HONOURED.update(startup.ENGINE_FLAGS)


def human_readable_int(value: str) -> int:
    """SGLang's --context-length type: an int, or one with an SI (k, M, G, T; decimals allowed)
    or IEC (Ki, Mi, Gi, Ti) suffix, as its help documents: '128k' -> 128000, '1Ki' -> 1024."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if not match:
        return int(value)
    number, suffix = match.groups()
    if suffix.endswith("i"):
        if "." in number:
            raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes like '{suffix}'.")
        return int(number) * 2 ** (10 * ("KMGT".index(suffix[0]) + 1))
    return int(float(number) * 10 ** (3 * ("kMGT".index(suffix) + 1)))


def _json(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {value!r} ({exc})") from exc


def _json_object(value: str) -> Any:
    parsed = _json(value)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(parsed).__name__}")
    return parsed


# The table's type names (SGLang's converter functions) -> a converter that refuses what they
# refuse. A name missing here converts as str; tests/standins fail when the table has one.
TYPES: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "nullable_str": str,
    "human_readable_int": human_readable_int,
    "loads": _json,
    "json_list_type": _json,
    "parse_cuda_graph_config_arg": _json_object,
    "parse_cuda_graph_backend_arg": str,
}


@functools.cache
def load_flag_table() -> dict[str, Any]:
    """SGLang's flags as data (package data of pd_standins)."""
    return json.loads(resources.files(__package__).joinpath(FLAG_TABLE).read_text())


class _Ignored(argparse.Action):
    """An SGLang flag the simulation does not read: accepted (after argparse's own checks of
    arity, type and choices) and remembered with its values for the start-up log."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        given = [] if self.nargs == 0 else values if isinstance(values, list) else [values]
        namespace.sim_ignored.extend([option_string or self.dest, *map(str, given)])


def _add_flag(group: Any, flag: dict[str, Any]) -> None:
    options, kind, nargs = flag["options"], flag["kind"], flag["nargs"]
    if kind == "help":
        group.add_argument(*options, action="help", help="show this help and exit")
        return
    honoured = flag["dest"] in HONOURED
    spec: dict[str, Any] = {"dest": flag["dest"], "required": flag["required"], "help": argparse.SUPPRESS}
    if honoured:
        spec["help"] = "honoured"
        spec["action"] = "store_true" if nargs == 0 else "store"
    else:
        spec["action"] = _Ignored
        spec["default"] = argparse.SUPPRESS
    if nargs == 0:
        if not honoured:
            spec["nargs"] = 0
        group.add_argument(*options, **spec)
        return
    if nargs is not None:
        spec["nargs"] = nargs
    spec["type"] = TYPES.get(flag["type"] or "str", str)
    if flag["choices"] is not None:
        spec["choices"] = flag["choices"]
    group.add_argument(*options, **spec)


def sglang_parser(table: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """An argparse parser shaped like SGLang's: same options, arities, types, choices, abbreviations."""
    table = table or load_flag_table()
    p = argparse.ArgumentParser(
        prog=PROG,
        description=f"Rehearsal engine: takes SGLang {table['sglang_version']}'s command line "
        "(no GPU, no model; output is canned or filler).",
        allow_abbrev=table["allow_abbrev"],
        prefix_chars=table["prefix_chars"],
        add_help=False,
        epilog=sim_parser().format_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group = p.add_argument_group(f"SGLang {table['sglang_version']} flags (the simulation reads those shown)")
    for flag in table["flags"]:
        _add_flag(group, flag)
    p.set_defaults(**HONOURED)
    return p


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        sys.exit(f"{PROG}: {name}={raw!r} is not a number")


def sim_parser() -> argparse.ArgumentParser:
    """The simulator's own knobs. Exact names only, so they never abbreviate an SGLang flag."""
    p = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    sim = p.add_argument_group("simulator knobs (flag, else PD_SIM_* environment variable)")
    sim.add_argument("--sim-ttft-ms", type=float, default=_env_float("PD_SIM_TTFT_MS", 40.0),
                     help="simulated prefill time per request (PD_SIM_TTFT_MS, default 40)")  # fmt: skip
    sim.add_argument("--sim-tpot-ms", type=float, default=_env_float("PD_SIM_TPOT_MS", 10.0),
                     help="simulated time per output token (PD_SIM_TPOT_MS, default 10)")  # fmt: skip
    sim.add_argument("--sim-startup-delay-s", type=float, default=_env_float("PD_SIM_STARTUP_DELAY_S", 0.0),
                     help="answer /health 503 this long after start, like a loading model")  # fmt: skip
    sim.add_argument("--sim-rendezvous-timeout-s", type=float,
                     default=_env_float("PD_SIM_RENDEZVOUS_TIMEOUT_S",
                                        _env_float("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0)),
                     help="how long the decode waits for its room (PD_SIM_RENDEZVOUS_TIMEOUT_S, else "
                          "SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT, default 300)")  # fmt: skip
    sim.add_argument("--sim-bootstrap-timeout-s", type=float,
                     default=_env_float("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0),
                     help="the prefill fails a room no decode took this long after the request arrived "
                          "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300)")  # fmt: skip
    sim.add_argument("--sim-heartbeat-interval-s", type=float,
                     default=_env_float("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0),
                     help="seconds between the decode's pings of a prefill it waits on, at least 2 "
                          "(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, default 5)")  # fmt: skip
    sim.add_argument("--sim-heartbeat-max-failure", type=int,
                     default=int(_env_float("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)),
                     help="missed pings in a row that fail the rooms of that prefill, at least 1 "
                          "(SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE, default 2)")  # fmt: skip
    startup.add_knobs(sim)
    sim.add_argument("--sim-canned-completions", default=os.environ.get("PD_SIM_CANNED_COMPLETIONS"),
                     help="JSON file: prompt prefix -> continuation (PD_SIM_CANNED_COMPLETIONS)")  # fmt: skip
    sim.add_argument("--sim-profile-dir", default=os.environ.get("SGLANG_TORCH_PROFILER_DIR"))
    sim.add_argument("--sim-sglang-python", default=os.environ.get("PD_SIM_SGLANG_PYTHON"),
                     help="<venv>/bin/python a real engine would run from: its sglang version and patch"
                     " series are reported in /server_info and in every response's header")  # fmt: skip
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The --sim-* knobs first, then everything else exactly as SGLang's parser would (exit 2 on
    a refusal). Both land in one namespace; `sim_ignored` lists the flags not simulated."""
    argv = list(sys.argv[1:] if argv is None else argv)
    knobs, rest = sim_parser().parse_known_args(argv)
    args = sglang_parser().parse_args(rest, namespace=argparse.Namespace(sim_ignored=[]))
    for key, value in vars(knobs).items():
        setattr(args, key, value)
    return args


def config_from_args(argv: Sequence[str] | None = None) -> tuple[SimConfig, list[str]]:
    """Parse argv into a SimConfig; return it with the SGLang flags that were accepted but not simulated."""
    args = parse_args(argv)
    model_checks.refuse(args, load_flag_table())  # what the model refuses after the parser (exits 1)
    try:
        canned = CannedCompletions.load(
            args.sim_canned_completions, os.environ.get("PD_SIM_CANNED_COMPLETIONS_JSON") or None
        )
    except CannedCompletionsError as exc:
        sys.exit(f"{PROG}: {exc}")
    config = SimConfig(
        role=args.disaggregation_mode,
        host=args.host,
        port=args.port,
        bootstrap_port=args.disaggregation_bootstrap_port,
        model_path=args.model_path,
        served_model_name=args.served_model_name,
        tp_size=args.tp_size,
        api_key=args.api_key,
        context_length=args.context_length,
        max_running_requests=args.max_running_requests,
        enable_metrics=args.enable_metrics,
        ttft_s=args.sim_ttft_ms / 1000.0,
        tpot_s=args.sim_tpot_ms / 1000.0,
        startup_delay_s=args.sim_startup_delay_s,
        rendezvous_timeout_s=args.sim_rendezvous_timeout_s,
        pd=PdTimeouts(
            args.sim_bootstrap_timeout_s, args.sim_heartbeat_interval_s, args.sim_heartbeat_max_failure
        ),
        profile_dir=args.sim_profile_dir,
        canned=canned,
        sglang_python=args.sim_sglang_python,
        launch_args=args,
    )
    return config, list(args.sim_ignored)


async def _main(config: SimConfig, argv: list[str]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if not await _start_up(config, stop, argv):
        return
    await serve(config, stop=stop)


async def _start_up(config: SimConfig, stop: asyncio.Event, argv: list[str]) -> bool:
    """SGLang's start-up (pd_standins.engine.startup) before the port opens; False when stopped meanwhile.
    Then /health answers 503 through the warm-up request (one TTFT + TPOT), as SGLang's does."""
    task = asyncio.ensure_future(startup.start(config.launch_args, config.role))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        return False
    stopped.cancel()
    pool = task.result().pool
    if pool is not None:
        config.max_running_requests = pool.max_running_requests
        config.max_total_num_tokens = pool.max_total_num_tokens
    elif config.max_running_requests is None:
        config.max_running_requests = UNSIZED_MAX_RUNNING_REQUESTS
    # SGLang's own start-up lines, with the scheduler's figures now that the pool is sized.
    startup_log.emit(argv, config, load_flag_table())
    config.startup_delay_s += config.ttft_s + config.tpot_s
    return True


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s pd-sim-worker %(levelname)s %(message)s")
    config, ignored = config_from_args(argv)
    log.info("%s starting: role=%s listen=%s:%d", SIMULATOR_BANNER, config.role, config.host, config.port)
    if config.role == "prefill":
        log.info("bootstrap listener on %s:%d", config.host, config.bootstrap_port)
    log.info(
        "simulated TTFT %.1f ms, %.2f ms/token, canned prefixes: %s",
        config.ttft_s * 1000,
        config.tpot_s * 1000,
        [prefix for prefix, _ in config.canned.entries] or "none (filler text only)",
    )
    if ignored:
        log.info("accepted SGLang flags with no effect on a simulation: %s", " ".join(ignored))
    try:
        asyncio.run(_main(config, list(sys.argv[1:] if argv is None else argv)))
    except (HostContractError, LaunchRefused) as exc:
        # SGLang's kind of failure, its last lines as Python prints them: supervisor's log tail names it.
        for line in str(exc).splitlines():
            log.error("%s", line)
        return 1
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
