"""The engine and router command lines, built from the role's variables.

One function per program; each takes a plain dict (what the role's variables hold) and returns
argv. Keeping the flag spelling here, not in a template, lets the tests assert on exact argv and
lets the rehearsal swap only the engine command in front of the same flags.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pd_appliance.serving.supervisor_format import flatten

WORKER_ROLES = ("prefill", "decode", "aggregated")
AGGREGATED = "aggregated"


class CommandError(ValueError):
    """A setting cannot become a flag; the message names the variable."""


def _flag(argv: list[str], flag: str, value: Any) -> None:
    """Append `flag value`; True -> bare flag; None, "" and False -> nothing."""
    if value is None or value is False or value == "":
        return
    if value is True:
        argv.append(flag)
    elif isinstance(value, (list, tuple)):
        argv.append(flag)
        argv.extend(str(v) for v in value)
    else:
        argv.append(flag)
        argv.append(str(value))


def sglang_argv(engine_command: Sequence[str], role: str, s: Mapping[str, Any]) -> list[str]:
    """`python -m sglang.launch_server ...` for one instance role (SGLang 0.5.23 flag names).

    prefill/decode: a PD engine (--disaggregation-mode, its transfer backend and bootstrap port).
    aggregated: no --disaggregation-* flag at all (SGLang's default mode "null": prefill and decode
    in one engine, server_args.py's disaggregation_mode), so nothing of PD reaches it.
    """
    if role not in WORKER_ROLES:
        raise CommandError(f"role must be prefill, decode or aggregated, got {role!r}")
    pd = role != AGGREGATED
    if not engine_command:
        raise CommandError("serving_engine_command is empty: it names the program that serves the model")
    argv = [str(w) for w in engine_command]
    _flag(argv, "--model-path", s["model_path"])
    _flag(argv, "--served-model-name", s.get("served_model_name"))
    _flag(argv, "--trust-remote-code", bool(s.get("trust_remote_code")))
    _flag(argv, "--tp-size", int(s["tp_size"]))
    _flag(argv, "--host", s["host"])
    _flag(argv, "--port", int(s["port"]))
    if pd:
        _flag(argv, "--disaggregation-mode", role)
        _flag(argv, "--disaggregation-transfer-backend", s.get("transfer_backend"))
        _flag(argv, "--disaggregation-bootstrap-port", s.get("bootstrap_port") if role == "prefill" else None)
        _flag(argv, "--disaggregation-ib-device", s.get("ib_device"))
    _flag(argv, "--moe-runner-backend", s.get("moe_runner_backend"))
    _flag(argv, "--kv-cache-dtype", s.get("kv_cache_dtype"))
    _flag(argv, "--mem-fraction-static", s.get("mem_fraction_static"))
    _flag(argv, "--context-length", s.get("context_length"))
    _flag(argv, "--max-running-requests", s.get("max_running_requests"))
    _flag(argv, "--chunked-prefill-size", s.get("chunked_prefill_size"))
    _flag(argv, "--enable-metrics", bool(s.get("enable_metrics")))
    if s.get("cuda_graph", True) and pd:
        _flag(argv, f"--cuda-graph-max-bs-{role}", s.get("cuda_graph_max_bs"))
    elif s.get("cuda_graph", True):
        # An aggregated engine runs both kinds of forward, so it captures both kinds of graph: SGLang
        # 0.5.23 turns off only the other phase's graphs of a PD engine (arg_groups/cuda_graph_hook.py,
        # apply_cuda_graph_disaggregation_roles), none of a "null"-mode one. `cuda_graph_max_bs` is
        # then {"prefill": ..., "decode": ...}: the prefill's and the decode's settings, each for its
        # phase (serving_prefill_cuda_graph_max_bs, serving_decode_cuda_graph_max_bs).
        graphs = s.get("cuda_graph_max_bs") or {}
        if not isinstance(graphs, Mapping):
            raise CommandError(
                "an aggregated instance takes cuda_graph_max_bs as {prefill: N, decode: N} (its two phases)"
            )
        _flag(argv, "--cuda-graph-max-bs-prefill", graphs.get("prefill"))
        _flag(argv, "--cuda-graph-max-bs-decode", graphs.get("decode"))
    else:
        argv.append("--disable-cuda-graph")
    spec = s.get("speculative") or {}
    algorithm = spec.get("algorithm")
    if algorithm:
        if str(algorithm).upper() not in ("EAGLE", "DSPARK"):
            raise CommandError(
                f"serving_speculative_algorithm={algorithm!r}: DeepSeek-V4 accepts EAGLE (topk 1) or "
                f"DSPARK (not with PD); use EAGLE or '' to turn speculative decoding off"
            )
        if str(algorithm).upper() == "DSPARK":  # aggregated too: the appliance has not checked it
            raise CommandError("serving_speculative_algorithm=DSPARK does not work with PD: use EAGLE or ''")
        if int(spec.get("eagle_topk", 1)) != 1:
            raise CommandError("serving_speculative_eagle_topk must be 1 for DeepSeek-V4 EAGLE (MTP)")
        _flag(argv, "--speculative-algorithm", str(algorithm).upper())
        _flag(argv, "--speculative-num-steps", spec.get("num_steps"))
        _flag(argv, "--speculative-eagle-topk", spec.get("eagle_topk"))
        _flag(argv, "--speculative-num-draft-tokens", spec.get("num_draft_tokens"))
    _flag(argv, "--log-level", s.get("log_level"))
    argv.extend(flatten(s.get("extra_args") or []))
    return argv


def retry_delays_ms(attempts: int, initial_ms: float, max_ms: float, multiplier: float) -> list[float]:
    """The backoff smg 1.13 sleeps between `attempts` tries, before jitter (ms).

    smg's RetryExecutor (routers/common/retry.rs): `--retry-max-retries` counts every attempt, the
    first included; after failed attempt a (0-based) it sleeps min(initial * multiplier**a, max).
    """
    delays: list[float] = []
    delay = float(initial_ms)
    for _ in range(max(attempts - 1, 0)):
        delays.append(min(delay, float(max_ms)))
        delay = min(delay * multiplier, float(max_ms))
    return delays


def retry_window_s(
    attempts: int, initial_ms: float, max_ms: float, multiplier: float, jitter: float
) -> tuple[float, float]:
    """(shortest, longest) seconds from a request's first attempt to its last; jitter is +-jitter."""
    total = sum(retry_delays_ms(attempts, initial_ms, max_ms, multiplier)) / 1000.0
    return total * (1.0 - jitter), total * (1.0 + jitter)


def retry_attempts_for(
    grace_s: float, initial_ms: float, max_ms: float, multiplier: float, jitter: float
) -> int:
    """Fewest attempts whose backoff, at the jitter's low end, lasts at least `grace_s` seconds."""
    floor_ms = float(max_ms) * (1.0 - jitter)
    if floor_ms <= 0:
        raise CommandError("serving_router_retry_jitter_factor must be below 1: the backoff could be zero")
    attempts = 1
    while retry_window_s(attempts, initial_ms, max_ms, multiplier, jitter)[0] < grace_s:
        attempts += 1
    return attempts


def health_failure_threshold_for(grace_s: float, interval_s: float) -> int:
    """Failed health probes in a row that take longer than `grace_s` (the first may come at once)."""
    return math.ceil(float(grace_s) / float(interval_s)) + 1


def _resilience(s: Mapping[str, Any]) -> dict[str, Any]:
    """smg's retry, breaker, health and recovery settings; the outage grace sizes what is left null.

    smg 1.13 answers a request that finds no healthy worker (or only open circuits) for a role with
    503 no_available_workers at once and never retries it, while it retries a 502 from a dead worker
    with backoff. So a worker restart costs nothing but the requests in flight on it exactly when,
    for the whole restart, the worker stays "healthy" in smg's eyes and the retries last: both are
    sized from `outage_grace_s` unless given.
    """
    grace = s.get("outage_grace_s")
    out: dict[str, Any] = {}
    backoff: tuple[Any, Any, Any] = (
        s.get("retry_initial_backoff_ms"),
        s.get("retry_max_backoff_ms"),
        s.get("retry_backoff_multiplier"),
    )
    jitter: Any = s.get("retry_jitter_factor")
    if grace is not None:
        if float(grace) <= 0:
            raise CommandError(f"serving_router_worker_outage_grace_s must be positive, got {grace!r}")
        missing = [n for n, v in zip(("initial", "max", "multiplier"), backoff, strict=True) if v is None]
        if missing or jitter is None or s.get("health_check_interval_secs") is None:
            raise CommandError(
                "serving_router_worker_outage_grace_s needs serving_router_retry_initial_backoff_ms, "
                "_retry_max_backoff_ms, _retry_backoff_multiplier, _retry_jitter_factor and "
                "serving_router_health_check_interval_secs to size the retries and health threshold"
            )
    if backoff[0] is not None and float(backoff[0]) <= 0:
        raise CommandError(f"serving_router_retry_initial_backoff_ms must be > 0 (smg), got {backoff[0]}")
    if backoff[0] is not None and backoff[1] is not None and float(backoff[1]) < float(backoff[0]):
        raise CommandError(
            f"serving_router_retry_max_backoff_ms={backoff[1]} is below "
            f"serving_router_retry_initial_backoff_ms={backoff[0]} (smg refuses it)"
        )
    if backoff[2] is not None and float(backoff[2]) < 1.0:
        raise CommandError(f"serving_router_retry_backoff_multiplier must be >= 1 (smg), got {backoff[2]}")
    if jitter is not None and not 0.0 <= float(jitter) < 1.0:
        raise CommandError(f"serving_router_retry_jitter_factor must be in [0, 1), got {jitter}")
    attempts = s.get("retry_max_retries")
    if attempts is None and grace is not None:
        # With a grace, the check above has every backoff figure and the jitter set.
        initial_ms, max_ms, multiplier = (float(v) for v in backoff)
        attempts = retry_attempts_for(float(grace), initial_ms, max_ms, multiplier, float(jitter))
    threshold = s.get("health_failure_threshold")
    if threshold is None and grace is not None:
        threshold = health_failure_threshold_for(float(grace), float(s["health_check_interval_secs"]))
    out["--retry-max-retries"] = attempts
    out["--retry-initial-backoff-ms"] = backoff[0]
    out["--retry-max-backoff-ms"] = backoff[1]
    out["--retry-backoff-multiplier"] = backoff[2]
    out["--retry-jitter-factor"] = jitter
    out["--health-failure-threshold"] = threshold
    out["--health-success-threshold"] = s.get("health_success_threshold")
    return out


def router_argv(router_command: Sequence[str], s: Mapping[str, Any]) -> list[str]:
    """smg 1.13.0's command line, in the mode the workers need, its workers read from a file.

    PD: `smg launch --pd-disaggregation --discovery-provider file --discovery-file F --policy P`.
    Aggregated (`s["aggregated"]`): smg's regular mode, the same without --pd-disaggregation, with
    `--policy A` (smg/router_args.py, RouterArgs.add_cli_args: --policy is the one policy of regular
    mode, COMMON_POLICY_CHOICES), A being `aggregated_policy`.

    The workers are not on the command line: smg's file discovery (`smg launch --help`, "Workers
    listed in a JSON manifest": --discovery-file "may be created after startup", "reread as soon as
    it changes" and every --discovery-check-interval-secs) reads them from `s["discovery_file"]`,
    which the play writes (`router_workers`, pd_appliance.serving.discovery). A fleet change then
    rewrites that file and leaves this command line, and the running router, alone (docs/fleet.md).
    The workers given here only decide the mode and are checked as the file's content is.
    """
    argv = [str(w) for w in router_command]
    mode, _ = router_workers(s.get("prefill") or [], s.get("decode") or [], s.get("aggregated") or [])
    aggregated = mode == "aggregated"
    if not s.get("discovery_file"):
        raise CommandError(
            "the router reads its workers from a discovery file: set serving_router_discovery_file"
        )
    if not aggregated:
        argv.append("--pd-disaggregation")
    argv += ["--discovery-provider", "file", "--discovery-file", str(s["discovery_file"])]
    _flag(argv, "--discovery-check-interval-secs", s.get("discovery_check_interval_secs"))
    _flag(argv, "--host", s["host"])
    _flag(argv, "--port", int(s["port"]))
    _flag(argv, "--policy", s.get("aggregated_policy") if aggregated else s.get("policy"))
    _flag(argv, "--prometheus-host", s.get("prometheus_host") if s.get("prometheus_port") else None)
    _flag(argv, "--prometheus-port", s.get("prometheus_port"))
    _flag(argv, "--health-check-endpoint", s.get("health_check_endpoint"))
    _flag(argv, "--health-check-interval-secs", s.get("health_check_interval_secs"))
    _flag(argv, "--health-check-timeout-secs", s.get("health_check_timeout_secs"))
    for flag, value in _resilience(s).items():
        _flag(argv, flag, value)
    if s.get("circuit_breaker") is False:
        argv.append("--disable-circuit-breaker")
    else:
        _flag(argv, "--cb-failure-threshold", s.get("cb_failure_threshold"))
        _flag(argv, "--cb-success-threshold", s.get("cb_success_threshold"))
        _flag(argv, "--cb-timeout-duration-secs", s.get("cb_timeout_duration_secs"))
        _flag(argv, "--cb-window-duration-secs", s.get("cb_window_duration_secs"))
    remove = s.get("remove_unhealthy_workers")
    if remove is not None:
        argv.append("--remove-unhealthy-workers" if remove else "--no-remove-unhealthy-workers")
    if not aggregated:  # a PD-mode setting (a full decode's admission queue)
        _flag(argv, "--pd-admission-wait-secs", s.get("pd_admission_wait_secs"))
    _flag(argv, "--max-concurrent-requests", s.get("max_concurrent_requests"))
    _flag(argv, "--queue-size", s.get("queue_size"))
    _flag(argv, "--queue-timeout-secs", s.get("queue_timeout_secs"))
    _flag(argv, "--worker-startup-timeout-secs", s.get("worker_startup_timeout_secs"))
    _flag(argv, "--worker-startup-check-interval", s.get("worker_startup_check_interval_secs"))
    _flag(argv, "--request-timeout-secs", s.get("request_timeout_secs"))
    _flag(argv, "--shutdown-grace-period-secs", s.get("shutdown_grace_period_secs"))
    _flag(argv, "--log-level", s.get("log_level"))
    _flag(argv, "--log-json", bool(s.get("log_json")))
    argv.extend(flatten(s.get("extra_args") or []))
    return argv


def router_workers(
    prefills: Sequence[Mapping[str, Any]],
    decodes: Sequence[Mapping[str, Any]],
    aggregated: Sequence[Mapping[str, Any]],
) -> tuple[str, list[dict[str, Any]]]:
    """The router's mode ("pd" or "aggregated") and its workers as smg's discovery manifest lists them.

    Each worker: `{"url", "worker_type"}` (prefill, decode, or smg's `regular` for an aggregated
    instance) and a prefill's `bootstrap_port` (smg's file discovery's fields,
    service_discovery/file.rs; without the port smg sends bootstrap_port null and decode silently
    uses its own default, so a prefill without one is refused). One mode per router: smg runs PD or
    regular, not both.
    """
    if aggregated and (prefills or decodes):
        raise CommandError(
            "the router has one mode: serving_instances mixes aggregated instances "
            f"({' '.join(str(w['url']) for w in aggregated)}) with prefill/decode instances "
            f"({' '.join(str(w['url']) for w in [*prefills, *decodes])}); set role: aggregated on every "
            "worker host's entries, or on none"
        )
    if aggregated:
        return "aggregated", [{"url": str(w["url"]), "worker_type": "regular"} for w in aggregated]
    if not prefills or not decodes:
        raise CommandError(
            "the router needs at least one prefill and one decode worker (or aggregated workers only): "
            "put hosts in the inventory groups 'prefill' and 'decode'"
        )
    workers: list[dict[str, Any]] = []
    for worker in prefills:
        if worker.get("bootstrap_port") in (None, ""):
            raise CommandError(
                f"prefill worker {worker['url']} has no bootstrap port (serving_bootstrap_port)"
            )
        workers.append(
            {
                "url": str(worker["url"]),
                "worker_type": "prefill",
                "bootstrap_port": int(worker["bootstrap_port"]),
            }
        )
    workers += [{"url": str(w["url"]), "worker_type": "decode"} for w in decodes]
    return "pd", workers


def admission_wait_errors(host: str, wait_s: float | str, bootstrap_timeout_s: float | str) -> list[str]:
    """smg's --pd-admission-wait-secs must stay below half of SGLang's bootstrap deadline.

    A dispatch smg holds for a full decode reaches the prefill only after the wait; the prefill frees
    the KV of a request no decode bootstrapped after SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, so a wait
    near that deadline turns a busy decode into requests that fail after their prefill was paid for.
    """
    if float(wait_s) * 2 < float(bootstrap_timeout_s):
        return []
    return [
        f"{host}: serving_router_pd_admission_wait_secs={wait_s} is not well under "
        f"serving_pd_bootstrap_timeout_s={bootstrap_timeout_s} (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT): "
        f"a dispatch smg holds that long can outlive the prefill's deadline. Keep the wait below half of it."
    ]


def worker_url(host: str, port: int | str) -> str:
    """http URL of a worker; IPv6 literals get brackets."""
    host = str(host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"
