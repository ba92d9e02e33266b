"""Preflight's network and secret refusals, called directly (pd_appliance.host_checks).

The README promises that preflight refuses an address the host does not have, a port another
process holds, a second supervisord on this deployment's config, workers beyond loopback without
the API key, an inet supervisor without a password and a control socket path a unix socket cannot
hold. Each rule is fed the bad input and the fixed one. The port case binds a real socket (port 0)
and reads it back through `ss` and `ps`, as roles/preflight/tasks/network.yml does.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

from pd_appliance import host_checks

HOST_ADDRESSES = ["10.20.30.40", "fe80::1"]


def test_an_address_the_host_does_not_have_is_refused() -> None:
    errors = host_checks.address_errors("h", "serving_advertise_host", "10.20.30.41", HOST_ADDRESSES)
    assert len(errors) == 1
    assert "serving_advertise_host=10.20.30.41 is not an address of this host" in errors[0]
    assert "10.20.30.40" in errors[0] and "host_vars/h.yml" in errors[0]
    # The fix: the host's own address (or loopback, which every host has).
    assert host_checks.address_errors("h", "serving_advertise_host", "10.20.30.40", HOST_ADDRESSES) == []
    assert host_checks.address_errors("h", "serving_advertise_host", "127.0.0.1", HOST_ADDRESSES) == []


def test_a_wildcard_is_a_bind_address_only_and_garbage_is_named() -> None:
    assert host_checks.address_errors("h", "serving_advertise_host", "0.0.0.0", HOST_ADDRESSES) != []
    assert (
        host_checks.address_errors(
            "h", "serving_worker_bind_host", "0.0.0.0", HOST_ADDRESSES, wildcard_ok=True
        )
        == []
    )
    assert (
        "is not an IP address"
        in host_checks.address_errors("h", "serving_router_host", "lab-1", HOST_ADDRESSES)[0]
    )
    assert "is empty" in host_checks.address_errors("h", "serving_advertise_host", "", HOST_ADDRESSES)[0]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port this test process holds (bind 0, listening) for as long as the test runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def _host_tables() -> tuple[list[dict], dict[int, dict]]:
    """What preflight reads on a host: `ss -Htlnp` and `ps -eo pid=,ppid=,args=`, parsed by preflight."""
    ss = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True, timeout=30).stdout
    ps = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True, timeout=30
    )
    return host_checks.parse_listeners(ss.splitlines()), host_checks.parse_processes(ps.stdout.splitlines())


def test_a_port_held_by_a_foreign_process_is_refused(held_port: int) -> None:
    listeners, processes = _host_tables()
    assert any(entry["port"] == held_port and os.getpid() in entry["pids"] for entry in listeners), (
        "ss did not name this process as the port's holder"
    )
    ports = {"serving_decode_port": held_port}
    errors = host_checks.listener_errors("h", ports, listeners, processes, own_supervisord=None)
    assert len(errors) == 1
    assert f"port {held_port} (serving_decode_port) is already held" in errors[0]
    assert f"pid {os.getpid()}" in errors[0] and "choose another serving_decode_port" in errors[0]
    # Held by a program of this deployment's supervisord (here: this process's parent) is fine.
    assert host_checks.listener_errors("h", ports, listeners, processes, own_supervisord=os.getppid()) == []


def test_a_free_port_passes(held_port: int) -> None:
    listeners, processes = _host_tables()
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))  # the wildcard: no listener on any address holds this port
        free = probe.getsockname()[1]  # bound, not listening: ss -l does not list it
    assert host_checks.listener_errors("h", {"serving_decode_port": free}, listeners, processes, None) == []


CONFIG = "/etc/pd-appliance/supervisor/supervisord.conf"
PROCESSES = {
    1: {"ppid": 0, "args": "/sbin/init"},
    100: {
        "ppid": 1,
        "args": f"/opt/pd-appliance/tools/bin/python /opt/pd-appliance/tools/bin/supervisord -c {CONFIG}",
    },
    200: {
        "ppid": 1,
        "args": f"/opt/pd-appliance/tools/bin/python /opt/pd-appliance/tools/bin/supervisord -c {CONFIG}",
    },
    300: {"ppid": 1, "args": "/usr/bin/supervisord -c /etc/supervisor/supervisord.conf"},
}


def test_a_second_supervisord_on_this_config_is_refused() -> None:
    errors = host_checks.supervisord_errors("h", CONFIG, 100, PROCESSES)
    assert len(errors) == 1, errors  # 300 runs another config: not this deployment's
    assert errors[0].startswith(f"h: supervisord pid 200 runs this deployment's config {CONFIG}")
    assert "kill 200" in errors[0]
    # No pidfile (the recorded one was deleted): both are strays.
    assert len(host_checks.supervisord_errors("h", CONFIG, None, PROCESSES)) == 2
    assert (
        host_checks.supervisord_errors("h", CONFIG, 100, {k: v for k, v in PROCESSES.items() if k != 200})
        == []
    )


def _secrets(**changes: object) -> list[str]:
    args = {"worker_host": True, "bind_host": "10.20.30.40", "require_api_key": True, "api_key_set": True,
            "inet_port": 0, "inet_password_set": False, **changes}  # fmt: skip
    return host_checks.secret_errors("h", **args)  # type: ignore[arg-type]


def test_workers_beyond_loopback_without_the_key_are_refused() -> None:
    assert _secrets() == []
    unset = _secrets(api_key_set=False)
    assert (
        len(unset) == 1
        and "listen on 10.20.30.40 (beyond loopback) but serving_router_api_key is empty" in unset[0]
    )
    off = _secrets(require_api_key=False)
    assert len(off) == 1 and "serving_worker_require_api_key is false" in off[0]
    # On loopback, or on a router-only host, no key is needed.
    assert _secrets(bind_host="127.0.0.1", require_api_key=False, api_key_set=False) == []
    assert _secrets(worker_host=False, require_api_key=False) == []


def test_an_inet_supervisor_without_a_password_is_refused() -> None:
    errors = _secrets(inet_port=9001)
    assert errors == [
        "h: serving_supervisor_inet_port=9001 opens supervisor's HTTP server without a password: set "
        "serving_supervisor_inet_password (ansible-vault) or the port to 0."
    ]
    assert _secrets(inet_port=9001, inet_password_set=True) == []


def test_a_socket_path_longer_than_a_unix_socket_holds_is_refused() -> None:
    base = "/r/" + "x" * 200
    fits = (base[: 107 - len("/supervisor.sock")]) + "/supervisor.sock"
    too_long = "/" + fits  # 108 bytes
    assert len(fits) == 107 and host_checks.socket_path_errors("h", fits) == []
    errors = host_checks.socket_path_errors("h", too_long)
    assert len(errors) == 1 and "is 108 bytes long; a unix socket path holds at most 107" in errors[0]
    # The kernel agrees: bind() takes the 107-byte path and refuses the 108-byte one.
    with socket.socket(socket.AF_UNIX) as sock, pytest.raises(OSError):
        sock.bind(too_long)


MONITORING = {
    "monitoring_enabled": True,
    "monitoring_on_prometheus_host": True,
    "monitoring_prometheus_port": 9090,
    "monitoring_node_exporter_enabled": True,
    "monitoring_node_exporter_port": 9100,
    "monitoring_gpu_exporter_enabled": True,
    "monitoring_gpu_exporter_port": 9835,
}
SERVING = {
    "serving_prefill_gpus": [0, 1, 2, 3], "serving_decode_gpus": [4, 5, 6, 7], "serving_prefill_tp_size": 4,
    "serving_decode_tp_size": 4, "serving_prefill_port": 30000, "serving_decode_port": 30001,
    "serving_bootstrap_port": 8998, "serving_router_port": 8000, "serving_router_metrics_port": 29000,
}  # fmt: skip


def test_the_monitor_stages_ports_are_in_preflights_port_set(held_port: int) -> None:
    ports = host_checks.host_ports(["prefill", "decode", "router"], {**SERVING, **MONITORING})
    assert {k: v for k, v in ports.items() if k.startswith("monitoring_")} == {
        "monitoring_prometheus_port": 9090,
        "monitoring_node_exporter_port": 9100,
        "monitoring_gpu_exporter_port": 9835,
    }
    # A host without Prometheus and without GPUs opens only its node exporter; disabled opens none.
    other = {**MONITORING, "monitoring_on_prometheus_host": False, "monitoring_gpu_exporter_enabled": "False"}
    router_only = host_checks.host_ports(["router"], {**SERVING, **other})
    assert [k for k in router_only if k.startswith("monitoring_")] == ["monitoring_node_exporter_port"]
    off = host_checks.host_ports(["router"], {**SERVING, **MONITORING, "monitoring_enabled": "false"})
    assert not [k for k in off if k.startswith("monitoring_")]
    # And a monitoring port another process holds is refused like a worker's.
    listeners, processes = _host_tables()
    taken = host_checks.host_ports(
        ["router"], {**SERVING, **MONITORING, "monitoring_prometheus_port": held_port}
    )
    errors = host_checks.listener_errors("h", taken, listeners, processes, None)
    assert [e for e in errors if f"port {held_port} (monitoring_prometheus_port) is already held" in e], (
        errors
    )
