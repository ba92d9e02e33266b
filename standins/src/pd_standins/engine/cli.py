"""pd-sim-worker: start a simulated SGLang worker (the rehearsal engine).

It takes the same flags the serving role gives `python -m sglang.launch_server`, so the rehearsal
swaps only the engine command. SGLang flags that change nothing in a simulation are accepted and
listed once at start-up. Simulator knobs are --sim-* flags or PD_SIM_* environment variables
(env hooks set the latter, so the rehearsal inventory needs no extra flags).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from pd_standins.engine import SIMULATOR_BANNER
from pd_standins.engine.bootstrap import PdTimeouts
from pd_standins.engine.server import ROLES, SimConfig, serve
from pd_standins.engine.text import CannedCompletions, CannedCompletionsError

log = logging.getLogger("pd_sim_worker")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        sys.exit(f"pd-sim-worker: {name}={raw!r} is not a number")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pd-sim-worker",
        description="Simulated SGLang worker for rehearsals (no GPU, no model; output is canned or filler).",
    )
    sg = p.add_argument_group("SGLang flags the simulator honours")
    sg.add_argument("--model-path", default="simulated-model")
    sg.add_argument("--served-model-name", default=None)
    sg.add_argument("--tp-size", "--tp", type=int, default=1)
    sg.add_argument("--host", default="127.0.0.1")
    sg.add_argument("--port", type=int, default=30000)
    sg.add_argument("--disaggregation-mode", choices=ROLES, default="null")
    sg.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    sg.add_argument("--api-key", default=None)
    sg.add_argument("--context-length", type=int, default=65536)
    sg.add_argument("--max-running-requests", type=int, default=256)
    sg.add_argument("--enable-metrics", action="store_true")
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
    sim.add_argument("--sim-canned-completions", default=os.environ.get("PD_SIM_CANNED_COMPLETIONS"),
                     help="JSON file: prompt prefix -> continuation (PD_SIM_CANNED_COMPLETIONS)")  # fmt: skip
    sim.add_argument("--sim-profile-dir", default=os.environ.get("SGLANG_TORCH_PROFILER_DIR"))
    return p


def config_from_args(argv: Sequence[str] | None = None) -> tuple[SimConfig, list[str]]:
    """Parse argv into a SimConfig; return it with the SGLang flags that were accepted but not simulated."""
    args, ignored = build_parser().parse_known_args(argv)
    try:
        canned = CannedCompletions.load(
            args.sim_canned_completions, os.environ.get("PD_SIM_CANNED_COMPLETIONS_JSON") or None
        )
    except CannedCompletionsError as exc:
        sys.exit(f"pd-sim-worker: {exc}")
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
    )
    return config, ignored


async def _main(config: SimConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await serve(config, stop=stop)


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
        asyncio.run(_main(config))
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
