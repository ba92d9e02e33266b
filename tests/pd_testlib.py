"""Helpers shared by the test areas: paths, and running ansible-playbook from the checkout's venv.

A module of its own (tests/ is on pytest's pythonpath) because every area has a conftest.py, and
`from conftest import ...` would pick whichever of them was imported first.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pd_appliance.serving.polling import poll

if TYPE_CHECKING:
    from pd_standins.engine.server import SimConfig

ROOT = Path(__file__).resolve().parents[1]
# The rehearsal engine's start-up rates for a test that starts it by hand: no JIT or graph-capture
# time (the rehearsal's declared rates are in inventory/rehearsal's overlay; the engine's defaults
# are the lab's expected figures, pd_standins.engine.startup).
FAST_ENGINE_START = {"PD_SIM_JIT_COMPILE_S": "0", "PD_SIM_GRAPH_CAPTURE_MS_PER_BS": "0"}
# The filter plugins of a rehearsal: the product's (ansible.cfg names only those) and the stand-ins'
# (the rehearsal inventories build their simulated GPUs with pd_standins' filters).
REHEARSAL_FILTER_PLUGINS = f"{ROOT / 'plugins/filter'}{os.pathsep}{ROOT / 'standins/plugins/filter'}"


def ansible_env() -> dict[str, str]:
    """Environment for ansible-playbook: this venv first on PATH, the checkout's ansible.cfg, the
    rehearsal's filter plugins (the product's and the stand-ins')."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["ANSIBLE_FILTER_PLUGINS"] = REHEARSAL_FILTER_PLUGINS
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    # The rehearsal's service user is $USER (inventory/rehearsal's overlay); a CI shell may not set it.
    env.setdefault("USER", "root" if os.geteuid() == 0 else os.getlogin())
    return env


def run_module(module: str, args: dict, *flags: str) -> dict:
    """One `ansible localhost -m MODULE` run under the host's own Python (/usr/bin/python3, as a lab
    host runs modules); its result, with `failed` and the `output` (rc 0 unless it failed)."""
    ansible = Path(sys.executable).parent / "ansible"
    cmd = [str(ansible), "localhost", "-c", "local", "-i", "localhost,", "-m", module,
           "-e", "ansible_python_interpreter=/usr/bin/python3",
           "-a", json.dumps(args), "--one-line", *flags]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=120, check=False
    )
    # One line: `localhost | SUCCESS => {...}` (CHANGED, FAILED! likewise).
    line = next(line for line in done.stdout.splitlines() if line.startswith("localhost | "))
    status, result = line.split(" => ", 1)
    return json.loads(result) | {"failed": "FAILED" in status, "output": done.stdout}


def run_playbook(
    playbook: str | Path,
    inventory: str | Path,
    *args: str,
    timeout: int = 900,
    env: dict[str, str] | None = None,
):
    """Run ansible-playbook from the checkout and return the CompletedProcess (never raises on rc);
    `env` replaces ansible_env() (a stand-in's knob for the modules a local host runs)."""
    binary = Path(sys.executable).parent / "ansible-playbook"
    cmd = [str(binary) if binary.exists() else "ansible-playbook", str(playbook), "-i", str(inventory), *args]
    return run_owned(cmd, timeout, env)


def run_owned(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run cmd from the checkout in a process group of its own; kill the whole group if the test gives up.

    subprocess.run's timeout kills only ansible-playbook: its forked task workers and the modules they
    run (a pd_bench load, a validate.yml of the tuner) would go on using the machine's two cores for
    minutes after the test failed, and slow every test after it. A program the play starts on purpose
    (supervisord) leaves the group by daemonizing (setsid) and is not touched.
    """
    process = subprocess.Popen(
        cmd, cwd=ROOT, env=env or ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # the timeout, or pytest interrupting the test: leave nothing running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)


# Ports a test reserves for programs it cannot hand a listening socket (an inventory's ports, written
# before the play starts them): taken below the kernel's ephemeral range, so no bind(0) or outgoing
# connection is ever given one, and locked by a file per port, so no other test process picks it.
PORT_LOCK_DIR = Path("/tmp/pd-test-ports")
_HELD_PORTS: list[int] = []  # lock file descriptors, held until this process exits


def ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def appliance_default_ports() -> set[int]:
    """The appliance's default ports (a rehearsal from the checkout runs on them): never reserved."""
    found = set()
    for defaults in ROOT.glob("roles/*/defaults/main.yml"):
        found |= {int(n) for n in re.findall(r"^\w+_port:\s*(\d+)\s*$", defaults.read_text(), re.MULTILINE)}
    return found


def port_pool() -> list[int]:
    """10,000 ports just below the ephemeral range (above it when it starts too low), shuffled."""
    low, high = ephemeral_range()
    pool = range(low - 10000, low) if low - 10000 >= 1024 else range(high + 1, min(high + 10001, 65536))
    ports = sorted(set(pool) - appliance_default_ports())
    random.shuffle(ports)
    return ports


def _bindable(port: int) -> bool:
    """Nothing listens on the port now, on any address (servers set SO_REUSEADDR, so TIME_WAIT is no bar)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def reserve_ports(count: int) -> list[int]:
    """`count` TCP ports this test process owns until it exits: outside the ephemeral range, free now,
    and locked (flock on PORT_LOCK_DIR/<port>.lock) against every other xdist worker or helper.

    Why not bind(0) and close: the kernel hands a closed ephemeral port to the next socket that asks
    (an smg connection, another test's server), and the inventory's programs bind it minutes later.
    A server the test starts itself should bind 0 and report its port instead."""
    if not PORT_LOCK_DIR.is_dir():
        PORT_LOCK_DIR.mkdir(exist_ok=True)
        PORT_LOCK_DIR.chmod(0o1777)  # shared by every user's test runs, like /tmp
    chosen: list[int] = []
    for port in port_pool():
        fd = os.open(PORT_LOCK_DIR / f"{port}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not _bindable(port):
            os.close(fd)  # someone outside the tests holds it: leave it
            continue
        _HELD_PORTS.append(fd)
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise RuntimeError(f"no {count} free ports left to reserve under {PORT_LOCK_DIR}")


# Every port a rehearsal's programs listen on (serving and the monitor stage; a host gate's private smg,
# while a host joins): a private inventory copy reserves all of them, so that no stage of it meets another
# test's programs or the checkout's rehearsal.
REHEARSAL_PORTS = (
    "serving_prefill_port", "serving_decode_port", "serving_bootstrap_port", "serving_router_port",
    "serving_router_metrics_port", "monitoring_prometheus_port", "monitoring_node_exporter_port",
    "monitoring_gpu_exporter_port", "serving_fleet_gate_port", "serving_fleet_gate_metrics_port",
)  # fmt: skip


def rehearsal_ports() -> dict[str, int]:
    """REHEARSAL_PORTS, each a port this test process reserved (reserve_ports)."""
    return dict(zip(REHEARSAL_PORTS, reserve_ports(len(REHEARSAL_PORTS)), strict=True))


def private_artifacts(base: Path) -> dict[str, str]:
    """Variables that move a run's controller-side artifacts (generated router key, wheel build,
    validation reports, diagnostics bundles) from the checkout's artifacts/ to base/artifacts, so
    tests running side by side never read or overwrite one another's (or a developer's) files."""
    artifacts = base / "artifacts"
    return {
        "appliance_artifacts_dir": str(artifacts),
        "day2_diagnostics_local_dir": str(artifacts / "diagnostics"),
    }


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (the state field follows the command's ')')."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def reap(pids: Iterable[int | None], timeout_s: float = 60.0) -> None:
    """Wait up to `timeout_s` for the processes to exit (supervisord was told to shut down), then
    SIGKILL those that linger: only the pids a test saw its own deployment start."""
    candidates = {p for p in pids if p}
    deadline = time.monotonic() + timeout_s
    while candidates and time.monotonic() < deadline:
        candidates = {p for p in candidates if alive(p)}
        time.sleep(0.5)
    for pid in candidates:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# DeepSeek-V4's dims for the model arithmetic tests (SGLang 0.5.23 DeepSeekV4Config defaults and the
# rehearsal checkpoint's layer order): 2 sliding-window layers, then ratio 4 and 128 alternating
# (21 + 20). Hand-computed figures in tests/model, tests/fabric and tests/standins use it.
DSV4_TEST_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "num_hidden_layers": 43,
    "qk_nope_head_dim": 448,
    "qk_rope_head_dim": 64,
    "index_head_dim": 128,
    "window_size": 128,
    "max_position_embeddings": 65536,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4],
    "num_nextn_predict_layers": 1,
}


def two_host_layout(prefill_host: dict, decode_host: dict, **shared: object) -> dict:
    """The lab's two-host variant as an inventory: prefill and router on gpu-prefill-01 (192.0.2.11),
    decode on gpu-decode-01 (192.0.2.12), workers bound to every address, KV over mlx5_0. Each host's
    address is its ansible_host and advertised address; `shared` adds group variables."""
    hosts = {"gpu-prefill-01": ("192.0.2.11", prefill_host), "gpu-decode-01": ("192.0.2.12", decode_host)}
    return {
        "pd_appliance": {
            "children": {
                "prefill": {"hosts": {"gpu-prefill-01": None}},
                "decode": {"hosts": {"gpu-decode-01": None}},
                "router": {"hosts": {"gpu-prefill-01": None}},
            },
            "hosts": {
                name: {"ansible_host": address, "serving_advertise_host": address, **extra}
                for name, (address, extra) in hosts.items()
            },
            "vars": {"serving_worker_bind_host": "0.0.0.0", "serving_ucx_net_devices": "mlx5_0:1",
                     "serving_ib_device": "mlx5_0", **shared},
        }
    }  # fmt: skip


@contextlib.asynccontextmanager
async def sim_workers(*configs: SimConfig) -> AsyncIterator[asyncio.Event]:
    """Rehearsal engines (pd_standins' pd-sim-worker) serving `configs` in this event loop: each is
    ready when the block starts (a port-0 config has the kernel's port written back), all stop when
    it ends. Yields the stop event, which a test's own watchers may share."""
    from pd_standins.engine.server import serve  # the engine's imports only for the tests that serve

    stop, tasks = asyncio.Event(), []
    try:
        for config in configs:
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(serve(config, ready=ready, stop=stop)))
            await asyncio.wait_for(ready.wait(), 5)
        yield stop
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def recap(stdout: str, host: str = "localhost") -> dict[str, int]:
    """`host`'s PLAY RECAP counts (ok, changed, unreachable, failed, ...) from ansible-playbook's
    output; fails the test, with the output's tail, when there is none."""
    match = re.search(rf"^{re.escape(host)}[ \t]+:[ \t]+((?:\w+=\d+[ \t]*)+)$", stdout, re.MULTILINE)
    assert match, stdout[-3000:]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def wait_http(url: str, timeout_s: float = 60.0) -> None:
    """Return once `url` answers 200 (a worker or router a test started); TimeoutError after `timeout_s`."""

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    if not poll(answers, bool, timeout_s, 0.2).settled:
        raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s")
