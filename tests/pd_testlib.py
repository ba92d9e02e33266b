"""Helpers shared by the test areas: paths, and running ansible-playbook from the checkout's venv.

A module of its own (tests/ is on pytest's pythonpath) because every area has a conftest.py, and
`from conftest import ...` would pick whichever of them was imported first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The rehearsal engine's start-up rates for a test that starts it by hand: no JIT or graph-capture
# time (the rehearsal's declared rates are in inventory/rehearsal's overlay; the engine's defaults
# are the lab's expected figures, pd_standins.engine.startup).
FAST_ENGINE_START = {"PD_SIM_JIT_COMPILE_S": "0", "PD_SIM_GRAPH_CAPTURE_MS_PER_BS": "0"}


def ansible_env() -> dict[str, str]:
    """Environment for ansible-playbook: this venv first on PATH, the checkout's ansible.cfg."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    return env


def run_playbook(playbook: str | Path, inventory: str | Path, *args: str, timeout: int = 900):
    """Run ansible-playbook from the checkout and return the CompletedProcess (never raises on rc)."""
    binary = Path(sys.executable).parent / "ansible-playbook"
    cmd = [str(binary) if binary.exists() else "ansible-playbook", str(playbook), "-i", str(inventory), *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on loopback right now (held together while chosen)."""
    import socket

    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


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
