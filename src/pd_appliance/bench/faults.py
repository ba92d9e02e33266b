"""What a fault costs: open-loop load through the router, a fault at a set moment, the figures.

    python -m pd_appliance.bench.faults --router http://127.0.0.1:8000 \
        --serverurl unix:///opt/pd-appliance/run/pd-appliance/supervisor.sock --fault kill:decode \
        [--rate 10 --duration-s 20 --fault-at-s 5 --max-tokens 32] [--out result.json]

Faults: kill:<program> (SIGKILL of pd:<program>'s process, e.g. decode, decode-1, aggregated-0,
router; supervisor restarts it),
restart:supervisord (where supervisord runs without systemd: pd:router stopped, supervisord shut
down, as the systemd unit stops it, then --start-command), and restart:unit (`systemctl stop` then
`systemctl start` of --unit, e.g. pd-appliance-supervisor: the unit's own ExecStop and KillMode do
the stopping, as at a reboot).
It runs on the host that runs the programs. tests/faults runs it against the rehearsal and asserts
the guarantees; benchmarks/faults.py writes the table.

Requests arrive at a fixed rate whatever happens to earlier ones (open loop: a client that fails
fast does not flood the figures), each a streamed completion of `max_tokens` tokens with ignore_eos,
on a fresh connection (a pooled connection to a killed router would fail for the client's reasons,
not the appliance's). Meanwhile the appliance's readiness is looked at every `look_interval_s`.
Figures, for requests sent before and after the fault:

- sent; in_flight: started before the fault, not finished at it; failed, of them failed_in_flight
  and failed_after (started at or after the fault); served_after.
- first_served_s: from the fault to the end of the first answer to a request sent after it.
- fail_window_s: from the fault to the start of the last failed request sent after it (0: none).
- recovered_s: from the fault to the end of the first answer to a request sent after that last
  failure (the first answer after the fault when none failed): the seconds to recover.
- wait_max_s: the longest answer to a request sent after the fault; baseline_latency_s: the median
  answer before it.
- not_ready_s / ready_again_s: the first readiness look after the fault that said not ready, and
  the first one after that which said ready again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from pd_appliance.bench.client import build_payload, stream_request
from pd_appliance.bench.workload import API_PATHS

# A program of group pd (pd_appliance.serving.topology's names): a worker instance, or the router.
PROGRAM = re.compile(r"^((prefill|decode|aggregated)(-[A-Za-z0-9_]+)?|router)$")


@dataclass(frozen=True)
class LoadSpec:
    """The open-loop load around one fault."""

    rate_rps: float = 10.0
    duration_s: float = 20.0
    fault_at_s: float = 5.0
    max_tokens: int = 32
    prompt_chars: int = 64
    request_timeout_s: float = 600.0
    api: str = "completions"
    look_interval_s: float = 0.25


@dataclass(frozen=True)
class Sample:
    """One request: when it was sent and answered (perf_counter seconds), and its error if any."""

    start: float
    end: float
    error: str | None


def figures(
    samples: Sequence[Sample],
    fault_at: float,
    looks: Sequence[tuple[float, bool]] = (),
) -> dict[str, Any]:
    """The per-fault figures (module docstring) from the requests and the readiness looks."""
    before = [s for s in samples if s.start < fault_at]
    after = [s for s in samples if s.start >= fault_at]
    in_flight = [s for s in before if s.end > fault_at]
    served_after = [s for s in after if s.error is None]
    failed_after = [s for s in after if s.error is not None]
    last_failure = max((s.start for s in failed_after), default=fault_at)
    recovered = min((s.end for s in served_after if s.start >= last_failure), default=None)
    baseline = [s.end - s.start for s in before if s.error is None and s.end <= fault_at]
    not_ready = next((t for t, ready in looks if t >= fault_at and not ready), None)
    ready_again = None
    if not_ready is not None:
        ready_again = next((t for t, ready in looks if t > not_ready and ready), None)
    errors: dict[str, int] = {}
    for s in samples:
        if s.error is not None:
            kind = s.error.split(":", 1)[0][:60]
            errors[kind] = errors.get(kind, 0) + 1

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - fault_at, 2)

    return {
        "sent": len(samples),
        "in_flight": len(in_flight),
        "failed": sum(1 for s in samples if s.error is not None),
        "failed_in_flight": sum(1 for s in in_flight if s.error is not None),
        "failed_after": len(failed_after),
        "served_after": len(served_after),
        "first_served_s": since(min((s.end for s in served_after), default=None)),
        "fail_window_s": since(last_failure),
        "recovered_s": since(recovered),
        "wait_max_s": round(max((s.end - s.start for s in served_after), default=0.0), 2),
        "baseline_latency_s": round(statistics.median(baseline), 3) if baseline else None,
        "not_ready_s": since(not_ready),
        "ready_again_s": since(ready_again),
        "errors": errors,
    }


async def _load(
    url: str,
    model: str,
    spec: LoadSpec,
    headers: dict[str, str],
    inject: Callable[[], float | None],
    looks: list[tuple[float, bool]],
) -> tuple[list[Sample], float, float]:
    """Send at the fixed rate, fault at fault_at_s (in a thread), wait for every answer."""
    endpoint = url.rstrip("/") + API_PATHS[spec.api]
    samples: list[Sample] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:

        async def one(i: int) -> None:
            prompt = f"request {i}: " + "x" * max(spec.prompt_chars - 12, 0)
            payload = build_payload(spec.api, model, prompt, spec.max_tokens, ignore_eos=True)
            record = await stream_request(session, endpoint, payload, spec.request_timeout_s, spec.max_tokens)
            # The client's own end: a cut stream's record ends at its last chunk, before the cut.
            samples.append(Sample(record.start, time.perf_counter(), record.error or None))

        async def fault() -> tuple[float, float]:
            await asyncio.sleep(spec.fault_at_s)
            called = time.perf_counter()
            at = await loop.run_in_executor(None, inject)
            # An injector may say when the fault itself happened (a kill after an RPC round trip).
            return (at if isinstance(at, float) else called), time.perf_counter()

        start = time.perf_counter()
        fault_task = asyncio.ensure_future(fault())
        tasks = []
        count = int(spec.rate_rps * spec.duration_s)
        for i in range(count):
            delay = start + i / spec.rate_rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(i)))
        fault_at, fault_done = await fault_task
        await asyncio.gather(*tasks)
    return samples, fault_at, fault_done


def measure(
    url: str,
    model: str,
    spec: LoadSpec,
    inject: Callable[[], float | None],
    look: Callable[[], bool] | None = None,
    api_key: str = "",
) -> dict[str, Any]:
    """Run the load with one fault; return the figures plus the raw timeline (relative seconds)."""
    looks: list[tuple[float, bool]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            at = time.perf_counter()
            try:
                ready = bool(look()) if look else True
            except Exception:  # a look that cannot be made says "not ready"
                ready = False
            looks.append((at, ready))
            stop.wait(spec.look_interval_s)

    watcher = threading.Thread(target=watch, daemon=True)
    if look is not None:
        watcher.start()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        samples, fault_at, fault_done = asyncio.run(_load(url, model, spec, headers, inject, looks))
    finally:
        stop.set()
        if look is not None:
            watcher.join(timeout=60)
    result = figures(samples, fault_at, looks)
    result["fault_s"] = round(fault_done - fault_at, 2)
    result["load"] = asdict(spec)
    result["timeline"] = {
        "requests": [
            [round(s.start - fault_at, 3), round(s.end - fault_at, 3), s.error]
            for s in sorted(samples, key=lambda s: s.start)
        ],
        "readiness": [[round(t - fault_at, 2), r] for t, r in looks],
    }
    return result


# ---- faults through supervisord -------------------------------------------------------------
def kill_program(serverurl: str, program: str) -> float:
    """SIGKILL pd:<program>'s process (supervisor sees it die and restarts it); when (perf_counter)."""
    from pd_appliance.serving.apply import connect

    info = connect(serverurl).supervisor.getProcessInfo(f"pd:{program}")
    if info["statename"] != "RUNNING" or not info["pid"]:
        raise RuntimeError(f"pd:{program} is {info['statename']}, not RUNNING: nothing to kill")
    at = time.perf_counter()
    os.kill(int(info["pid"]), signal.SIGKILL)
    return at


def restart_supervisord(serverurl: str, start_command: Sequence[str], timeout_s: float = 300.0) -> float:
    """A host reboot as the serving role stops and starts supervisord: pd:router stopped alone (the
    unit's ExecStop; smg finishes what it accepted), supervisord shut down (it stops the workers),
    then started with `start_command` (systemd at boot). Returns when the stop began (perf_counter)."""
    from pd_appliance.serving.apply import connect

    server = connect(serverurl)
    pid = int(server.supervisor.getPID())
    at = time.perf_counter()
    server.supervisor.stopProcess("pd:router", True)
    server.supervisor.shutdown()
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"supervisord (pid {pid}) still runs {timeout_s:g} s after shutdown")
        time.sleep(0.1)
    subprocess.run(list(start_command), check=True, timeout=timeout_s, capture_output=True)
    return at


def restart_unit(unit: str, timeout_s: float = 300.0) -> float:
    """`systemctl stop` then `systemctl start` of the supervisor's unit: its ExecStop (pd:router first)
    and KillMode=mixed stop the programs, as they do at a reboot. Returns when the stop began."""
    at = time.perf_counter()
    for verb in ("stop", "start"):
        subprocess.run(["systemctl", verb, unit], check=True, timeout=timeout_s, capture_output=True)
    return at


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":  # noqa: SIM115
            return False
    return True


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.bench.faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--router", required=True)
    parser.add_argument("--model", default="dsv4-flash")
    parser.add_argument("--serverurl", default="", help="supervisord's URL (kill, restart:supervisord)")
    parser.add_argument("--fault", required=True,
                        help="kill:<program> (prefill, decode-1, aggregated-0, router, ...), "
                             "restart:supervisord or restart:unit")  # fmt: skip
    parser.add_argument("--start-command", default="", help="how supervisord is started again")
    parser.add_argument("--unit", default="", help="restart:unit: the systemd unit that runs supervisord")
    parser.add_argument("--api-key-env", default="", help="environment variable holding the router's key")
    parser.add_argument("--rate", type=float, default=LoadSpec.rate_rps)
    parser.add_argument("--duration-s", type=float, default=LoadSpec.duration_s)
    parser.add_argument("--fault-at-s", type=float, default=LoadSpec.fault_at_s)
    parser.add_argument("--max-tokens", type=int, default=LoadSpec.max_tokens)
    parser.add_argument("--out", help="write the figures and the timeline here (JSON)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from pd_appliance.serving.readiness import check

    args = _parser().parse_args(argv)
    kind, _, target = args.fault.partition(":")
    if kind == "kill" and PROGRAM.match(target) and args.serverurl:

        def inject() -> float:
            return kill_program(args.serverurl, target)

    elif args.fault == "restart:supervisord" and args.start_command and args.serverurl:

        def inject() -> float:
            return restart_supervisord(args.serverurl, shlex.split(args.start_command))

    elif args.fault == "restart:unit" and args.unit:

        def inject() -> float:
            return restart_unit(args.unit)

    else:
        print(f"pd-faults: --fault {args.fault!r}: give kill:<program of group pd> with --serverurl, "
              "restart:supervisord with --serverurl and --start-command, or restart:unit with --unit",
              file=sys.stderr)  # fmt: skip
        return 2
    api_key = os.environ.get(args.api_key_env, "") if args.api_key_env else ""
    spec = LoadSpec(args.rate, args.duration_s, args.fault_at_s, args.max_tokens)
    result = measure(
        args.router, args.model, spec, inject, lambda: check(args.router, api_key)["ready"], api_key
    )
    result["fault"] = args.fault
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    summary = {k: v for k, v in result.items() if k not in ("timeline", "load")}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
