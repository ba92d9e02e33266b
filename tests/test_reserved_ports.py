"""reserve_ports (pd_testlib): ports outside the kernel's ephemeral range, never the same for two test
processes at once, never one something already listens on, and never an appliance default port."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pd_testlib
from pd_testlib import appliance_default_ports, ephemeral_range, reserve_ports

HERE = Path(__file__).resolve().parent


def test_reserved_ports_are_outside_the_ephemeral_range_and_the_defaults() -> None:
    low, high = ephemeral_range()
    ports = reserve_ports(20)
    assert len(set(ports)) == 20
    assert not any(low <= p <= high for p in ports), (low, high, ports)
    assert not set(ports) & appliance_default_ports()
    assert {29000, 30000, 30001} <= appliance_default_ports(), "the rehearsal's defaults are read"
    # A host gate's private smg (roles/serving serving_fleet_gate_*): never handed to a test's program.
    assert {8010, 29010} <= appliance_default_ports()
    assert {"serving_fleet_gate_port", "serving_fleet_gate_metrics_port"} <= set(pd_testlib.REHEARSAL_PORTS)


def test_another_process_never_gets_a_port_this_one_holds() -> None:
    mine = set(reserve_ports(200))
    # Another test process (an xdist worker), asking for as many, while this one holds them.
    code = "from pd_testlib import reserve_ports; print(' '.join(map(str, reserve_ports(200))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, timeout=60,
                         check=True, env={"PYTHONPATH": str(HERE), "PATH": ""}).stdout  # fmt: skip
    theirs = set(map(int, out.split()))
    assert len(theirs) == 200 and not mine & theirs


def test_a_port_someone_listens_on_is_skipped(monkeypatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        pool = pd_testlib.port_pool()
        monkeypatch.setattr(pd_testlib, "port_pool", lambda: [busy, *pool])
        assert busy not in reserve_ports(1)
