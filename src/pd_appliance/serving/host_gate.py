"""A host's own bs=1 gate: its instances measured on their own, before they join the fleet's router.

Why not through the fleet's router: smg pairs any prefill with any decode and spreads the requests
over every worker it lists (docs/fleet.md, "Pairing: PD pairs mix"), so a figure measured there is
the fleet's, not the host's, and listing a host in order to measure it already puts it in front of
users. So the gate starts a PRIVATE smg: the product's own command line (commands.router_argv with
the router's settings, plan.router_settings) pointed at a temporary discovery file that lists only
the gated instances, bound to loopback on a port of its own, the router's key handed to it
in-process (pd_appliance.serving.launch's shim: never on a command line). Through it, bs=1 requests
measured by the validation stage's client (pd_appliance.bench.runner: the correctness probe, a
warm-up, then the requests) are gated as the validate stage gates bs=1 (bench.gates.throughput_gates:
probe, failed requests, output tok/s against the threshold). The private smg is always stopped,
also on an error or a timeout.

The set gated must hold a prefill and a decode, or aggregated instances: a host of one PD role is
gated together with an in-rotation instance of the other role (discovery.companions).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pd_appliance.bench import gates, runner
from pd_appliance.serving import commands, discovery, fleet, plan
from pd_appliance.serving.launch import in_process_secrets
from pd_appliance.serving.polling import poll

# The environment variable that carries the router's key into the private smg's own process.
KEY_VARIABLE = "PD_HOST_GATE_ROUTER_API_KEY"
LOOPBACK = "127.0.0.1"
STOP_WAIT_S = 15.0
LOG_LINES = 8


class GateError(RuntimeError):
    """The gate could not measure; the message names what to fix."""


@dataclass(frozen=True)
class GateSpec:
    """What one gate measures and against what."""

    # pd_serving_topology's form: role, url, bootstrap_port, host (and name, the program pd:<name>).
    instances: Sequence[Mapping[str, Any]]
    # smg's command (serving_router_command) and every serving_router_* variable by name, with
    # serving_log_level: what plan.router_settings reads (the key left out).
    router_command: Sequence[str]
    settings: Mapping[str, Any]
    port: int
    metrics_port: int
    api_key: str
    threshold: float
    requests: int = 4
    output_len: int = 64
    input_len: int = 256
    timeout_s: float = 120.0
    model: str = ""
    api: str = "completions"


def hosts_of(instances: Sequence[Mapping[str, Any]]) -> list[str]:
    """The hosts of `instances`, in order, once each."""
    return list(dict.fromkeys(str(i.get("host")) for i in instances))


def set_problem(instances: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the set cannot be gated on its own (None when it can): smg routes a PD request to a
    prefill and a decode, and runs one mode (commands.router_workers)."""
    roles = {str(i["role"]) for i in instances}
    names = ", ".join(f"{i['role']} {i['url']} on {i.get('host')}" for i in instances) or "none"
    if commands.AGGREGATED in roles and roles - {commands.AGGREGATED}:
        return f"the instances mix aggregated and prefill/decode ({names}): smg runs one mode"
    if roles and roles <= {commands.AGGREGATED}:
        return None
    missing = [r for r in ("prefill", "decode") if r not in roles]
    if missing:
        return (
            f"the gated instances ({names}) hold no {' and no '.join(missing)}: a PD request needs "
            "both. Gate the host with an in-rotation instance of the missing role "
            "(__serving_gate_extra_instances), or with a host of that role"
        )
    return None


def private_argv(spec: GateSpec, discovery_file: Path) -> list[str]:
    """The product's smg command line (commands.router_argv over the router's settings) for the
    private router: loopback, the gate's ports, the gate's discovery file. The key is not on it. No
    shutdown grace: it is stopped once every request it carried has ended (the runner awaits each),
    and smg 1.13 otherwise spends 5 s of the play on its way out (measured)."""
    by_role = {r: [i for i in spec.instances if i["role"] == r] for r in commands.WORKER_ROLES}
    settings = {
        **plan.router_settings(spec.settings),
        **by_role,
        "discovery_file": str(discovery_file),
        "host": LOOPBACK,
        "port": int(spec.port),
        "prometheus_host": LOOPBACK,
        "prometheus_port": int(spec.metrics_port),
        "shutdown_grace_period_secs": 0,
    }
    return commands.router_argv(spec.router_command, settings)


def port_problem(port: int, variable: str) -> str | None:
    """Why the private smg cannot bind `port` on loopback (None when it can)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK, int(port)))
        except OSError as exc:
            return (
                f"port {port} ({variable}) is in use on the router host ({exc.strerror}): a gate still "
                f"running or another program (`ss -ltnp 'sport = :{port}'` names it); stop it or set "
                f"{variable} to a free port"
            )
    return None


def _program(instance: Mapping[str, Any]) -> str:
    return f"pd:{instance.get('name') or instance['role']}"


def _where(instance: Mapping[str, Any]) -> str:
    return f"{instance['role']} {instance['url']} ({_program(instance)} on {instance.get('host')})"


def dead_workers(instances: Sequence[Mapping[str, Any]], timeout_s: float = 5.0) -> list[str]:
    """The instances nothing answers on (a refused or timed-out connection), each named with its
    program and where to look."""
    dead = []
    for instance in instances:
        parts = urlsplit(str(instance["url"]))
        try:
            with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=timeout_s):
                pass
        except OSError as exc:
            dead.append(
                f"{_where(instance)} does not answer ({exc.strerror or exc}): "
                f"`supervisorctl status {_program(instance)}` and `supervisorctl tail {_program(instance)}` "
                f"on {instance.get('host')}"
            )
    return dead


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The private smg dies with the gate (Linux PR_SET_PDEATHSIG): a gate killed outright (SIGKILL,
    where no finally runs) leaves no router behind on the gate's port."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def start(argv: Sequence[str], api_key: str, log: Path) -> subprocess.Popen[bytes]:
    """Start the private smg in a session of its own, the key handed in-process (launch's shim), its
    output into `log`."""
    env = dict(os.environ)
    command = list(argv)
    if api_key:
        env[KEY_VARIABLE] = api_key
        command = in_process_secrets(command, [f"--api-key={KEY_VARIABLE}"], env)
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def stop(process: subprocess.Popen[bytes], wait_s: float = STOP_WAIT_S) -> None:
    """Stop the private smg and everything of its session: SIGTERM, then SIGKILL after `wait_s`."""
    for sig, wait in ((signal.SIGTERM, wait_s), (signal.SIGKILL, wait_s)):
        if process.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # anything the session left behind


@contextlib.contextmanager
def private_router(spec: GateSpec) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The private smg over the gated instances while the block runs; stopped whatever happens."""
    with tempfile.TemporaryDirectory(prefix="pd-host-gate-") as tmp:
        listed = discovery.manifest(spec.instances)
        path = Path(tmp) / "workers.json"
        discovery.write(path, listed)
        log = Path(tmp) / "smg.log"
        process = start(private_argv(spec, path), spec.api_key, log)
        try:
            yield process, log
        finally:
            stop(process)


def log_tail(log: Path, lines: int = LOG_LINES) -> str:
    """The private smg's last lines, for an error message."""
    with contextlib.suppress(OSError):
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    return ""


def wait_taken(spec: GateSpec, process: subprocess.Popen[bytes], log: Path) -> float:
    """Wait until the private smg lists every gated instance `ready`; the seconds waited, or
    GateError naming the instances it did not take (and where to look), or its exit."""
    client = fleet.SmgWorkers(f"http://{LOOPBACK}:{spec.port}", spec.api_key)
    urls = {str(i["url"]) for i in spec.instances}

    def look() -> dict[str, str] | None:
        if process.poll() is not None:
            return None
        try:
            return {w.url: w.status for w in client.all() if w.url in urls}
        except fleet.FleetError:
            return {}  # not answering yet: it is starting

    polled = poll(look, lambda seen: seen is None or _all_ready(seen, urls), spec.timeout_s, 0.2)
    if polled.seen is None:
        raise GateError(
            f"the private smg exited ({process.returncode}) before taking its workers: {log_tail(log)}"
        )
    if not polled.settled:
        late = [
            f"{_where(i)}: {polled.seen.get(str(i['url']), 'not registered')}; "
            f"`supervisorctl tail {_program(i)}` on {i.get('host')} shows why it does not answer"
            for i in spec.instances
            if polled.seen.get(str(i["url"])) != "ready"
        ]
        raise GateError(
            f"the private smg did not take every worker in {spec.timeout_s:g} s "
            f"(serving_fleet_gate_timeout_s): {'; '.join(late)}. Its log: {log_tail(log)}"
        )
    return polled.waited_s


def _all_ready(seen: Mapping[str, str], urls: set[str]) -> bool:
    return set(seen) == urls and all(status == "ready" for status in seen.values())


def measure(spec: GateSpec) -> dict[str, Any]:
    """bs=1 through the private smg with the validation stage's runner: the probe, one warm-up,
    then `requests` measured requests of `output_len` tokens."""
    measured = runner.plan_from_lists(
        f"http://{LOOPBACK}:{spec.port}",
        [1],
        [spec.requests],
        spec.input_len,
        spec.output_len,
        warmup_requests=[1],
        api=spec.api,
        request_timeout_s=spec.timeout_s,
        model=spec.model,
        api_key=spec.api_key,
        tokenizer=None,
        tokenizer_required=False,
        variant="host gate",
    )
    return runner.measure_sync(measured)


def verdict(measurement: Mapping[str, Any], threshold: float) -> tuple[bool, float | None, list[str]]:
    """The validate stage's bs=1 gates on the measurement: passed, the bs=1 output tok/s, and the
    failing gates' messages."""
    found = gates.throughput_gates(measurement, {1: float(threshold)})
    phase = next((p for p in measurement.get("phases") or [] if int(p["concurrency"]) == 1), None)
    tok_s = None if phase is None else round(float(phase["output_tok_s"]), 2)
    return gates.all_passed(found), tok_s, [g.message for g in found if not g.passed]


def run(spec: GateSpec) -> dict[str, Any]:
    """The gate, as one JSON-ready result: hosts, instances, requests, tok/s, threshold, passed, error.
    Never raises for what it can name: the error says what to fix."""
    result: dict[str, Any] = {
        "hosts": hosts_of(spec.instances),
        "instances": [str(i["url"]) for i in spec.instances],
        "requests": spec.requests,
        "output_len": spec.output_len,
        "output_tok_s": None,
        "threshold": spec.threshold,
        "passed": False,
        "error": None,
    }
    started = time.perf_counter()
    try:
        problems = [
            p
            for p in (
                set_problem(spec.instances),
                port_problem(spec.port, "serving_fleet_gate_port"),
                port_problem(spec.metrics_port, "serving_fleet_gate_metrics_port"),
            )
            if p
        ]
        problems += dead_workers(spec.instances)
        if problems:
            raise GateError("; ".join(problems))
        with private_router(spec) as (process, log):
            result["ready_after_s"] = round(wait_taken(spec, process, log), 2)
            passed, result["output_tok_s"], failing = verdict(measure(spec), spec.threshold)
        result["passed"] = passed
        if not passed:
            result["error"] = "; ".join(failing)
    except (GateError, commands.CommandError, fleet.FleetError, OSError, ValueError) as exc:
        result["error"] = str(exc)
    result["took_s"] = round(time.perf_counter() - started, 2)
    result["summary"] = summary(result)
    return result


def summary(result: Mapping[str, Any]) -> str:
    """The gate's outcome in one line, as the play prints it."""
    hosts = ", ".join(result["hosts"])
    figure = "not measured" if result["output_tok_s"] is None else f"{result['output_tok_s']:g} tok/s"
    if not result["passed"]:
        return f"{hosts} FAILED: bs=1 {figure}, threshold {result['threshold']:g} tok/s: {result['error']}"
    over = ", ".join(result["instances"])
    return (
        f"{hosts} passed: bs=1 {figure} >= {result['threshold']:g} (serving_fleet_gate_min_output_tok_s), "
        f"{result['requests']} requests of {result['output_len']} tokens over {over} "
        f"through a private smg ({result['took_s']:g} s)"
    )


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM (Ansible or a person stopping the gate): unwind, so the private smg is stopped."""
    raise SystemExit(128 + signum)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pd_appliance.serving.host_gate", description=__doc__.splitlines()[0])
    p.add_argument(
        "--instances", required=True, help="JSON list of the instances (pd_serving_topology's form)"
    )
    p.add_argument(
        "--router-command", required=True, help="JSON list: smg's command (serving_router_command)"
    )
    p.add_argument("--settings", required=True, help="JSON: every serving_router_* and serving_log_level")
    p.add_argument("--port", type=int, required=True, help="the private smg's port (loopback)")
    p.add_argument("--metrics-port", type=int, required=True, help="the private smg's metrics port")
    p.add_argument("--threshold", type=float, required=True, help="bs=1 output tok/s to reach")
    p.add_argument("--requests", type=int, default=4, help="measured bs=1 requests (after one warm-up)")
    p.add_argument("--output-len", type=int, default=64, help="output tokens per request")
    p.add_argument("--input-len", type=int, default=256, help="prompt length in characters")
    p.add_argument(
        "--timeout-s", type=float, default=120.0, help="bound on smg's readiness and on each request"
    )
    p.add_argument("--model", default="", help="the served model name ('' = the first of /v1/models)")
    p.add_argument("--api", default="completions", help="completions or chat")
    p.add_argument("--api-key-stdin", action="store_true", help="read the router's key from stdin")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pd_appliance.serving.host_gate --instances JSON ... --api-key-stdin` (the key on
    stdin, never on a command line): one JSON line; exit 0 when the gate passed, 1 otherwise."""
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    spec = GateSpec(
        instances=json.loads(args.instances),
        router_command=[str(c) for c in json.loads(args.router_command)],
        settings=json.loads(args.settings),
        port=args.port,
        metrics_port=args.metrics_port,
        api_key=sys.stdin.readline().strip() if args.api_key_stdin else "",
        threshold=args.threshold,
        requests=args.requests,
        output_len=args.output_len,
        input_len=args.input_len,
        timeout_s=args.timeout_s,
        model=args.model,
        api=args.api,
    )
    result = run(spec)
    print(json.dumps(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
