"""The rehearsal engine honours SGLang's PD deadlines and heartbeat (SGLANG_DISAGGREGATION_*).

Real pd-sim-worker processes on loopback, started with the environment the serving role renders,
killed with SIGKILL the way the fault suite kills them; requests are sent the way smg sends them.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from pd_standins.engine.bootstrap import PdTimeouts
from pd_standins.engine.cli import config_from_args
from pd_testlib import FAST_ENGINE_START, reserve_ports

WORKER = str(Path(sys.executable).parent / "pd-sim-worker")


def _free_port() -> int:
    """A port this test process reserved (pd_testlib.reserve_ports), not one bound and let go."""
    return reserve_ports(1)[0]


@contextmanager
def _worker(role: str, port: int, bootstrap: int, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    argv = [WORKER, "--model-path", "m", "--served-model-name", "dsv4-flash", "--port", str(port),
            "--enable-metrics", "--disaggregation-mode", role,
            "--disaggregation-bootstrap-port", str(bootstrap)]  # fmt: skip
    env = {**os.environ, **FAST_ENGINE_START, **env}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, f"{role} did not start"
                time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def _post(port: int, body: dict, timeout: float = 60) -> tuple[int, str, float]:
    started = time.monotonic()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.monotonic() - started


def _body(bootstrap: int, room: int) -> dict:
    return {"text": "hello", "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap, "bootstrap_room": room}  # fmt: skip


def _env(**values: str) -> dict[str, str]:
    """SGLANG_DISAGGREGATION_<NAME> variables from lower-case keyword names."""
    return {f"SGLANG_DISAGGREGATION_{name.upper()}": value for name, value in values.items()}


def _samples(metrics: str) -> dict[str, str]:
    return {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in metrics.splitlines() if "{" in line}


def _wait_gauge(port: int, name: str, value: str, timeout_s: float = 30) -> None:
    """Wait until the worker's own gauge says `value`: the state the next step needs, not a sleep."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        seen = _samples(metrics)[name]
        if seen == value:
            return
        assert time.monotonic() < deadline, f"{name} stayed {seen}, not {value}, for {timeout_s} s"
        time.sleep(0.02)


def test_the_cli_reads_sglangs_variables_with_sglangs_floors(monkeypatch) -> None:
    for name, value in _env(bootstrap_timeout="120", waiting_timeout="90", heartbeat_interval="0.5",
                            heartbeat_max_failure="0").items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PD_SIM_RENDEZVOUS_TIMEOUT_S", raising=False)
    config, _ = config_from_args(["--model-path", "m", "--disaggregation-mode", "decode"])
    assert config.pd == PdTimeouts(120.0, 2.0, 1)  # SGLang's floors: interval 2 s, 1 failure
    assert config.rendezvous_timeout_s == 90.0  # the decode's wait is the waiting timeout
    monkeypatch.setenv("PD_SIM_RENDEZVOUS_TIMEOUT_S", "7")
    assert config_from_args(["--model-path", "m"])[0].rendezvous_timeout_s == 7.0
    assert PdTimeouts() == PdTimeouts(300.0, 5.0, 2)  # SGLang 0.5.23's defaults (srt/environ.py)


def test_the_prefill_answers_once_the_decode_took_the_room() -> None:
    prefill, decode, bootstrap = _free_port(), _free_port(), _free_port()
    env = {"PD_SIM_TTFT_MS": "50"}
    with (
        _worker("prefill", prefill, bootstrap, env),
        _worker("decode", decode, bootstrap, env),
        ThreadPoolExecutor(1) as pool,
    ):
        room = random.getrandbits(63)
        prefill_leg = pool.submit(lambda: (*_post(prefill, _body(bootstrap, room)), time.monotonic()))
        # Prefilled, its KV waiting in the inflight queue for a decode: it must not have answered.
        _wait_gauge(prefill, "sglang:num_prefill_inflight_queue_reqs", "1.0")
        assert not prefill_leg.done(), "the prefill answered before a decode took its KV"
        decode_sent = time.monotonic()
        decode_status, _, _ = _post(decode, _body(bootstrap, room))
        status, _, _, answered = prefill_leg.result()
    assert (status, decode_status) == (200, 200) and answered >= decode_sent


def test_a_room_no_decode_takes_fails_at_the_bootstrap_timeout() -> None:
    prefill, bootstrap = _free_port(), _free_port()
    with _worker("prefill", prefill, bootstrap, _env(bootstrap_timeout="1.5")):
        status, text, elapsed = _post(prefill, _body(bootstrap, 7))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{prefill}/metrics", timeout=5).read().decode()
    assert status == 500 and "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" in text
    assert 1.5 <= elapsed < 5.0
    samples = _samples(metrics)
    assert samples["sglang:num_transfer_failed_reqs_total"] == "1.0"
    assert samples["sglang:num_prefill_inflight_queue_reqs"] == "0.0"


def test_a_dead_prefill_fails_the_waiting_decode_after_the_missed_heartbeats() -> None:
    prefill, decode, bootstrap = _free_port(), _free_port(), _free_port()
    env = _env(heartbeat_interval="2", heartbeat_max_failure="2", waiting_timeout="60")
    with (
        _worker("prefill", prefill, bootstrap, env) as prefill_proc,
        _worker("decode", decode, bootstrap, env),
        ThreadPoolExecutor(1) as pool,
    ):
        decode_leg = pool.submit(_post, decode, _body(bootstrap, 11))  # its prefill never comes
        _wait_gauge(decode, "sglang:num_decode_transfer_queue_reqs", "1.0")  # the decode waits for it
        prefill_proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        status, text, _ = decode_leg.result()
        detected = time.monotonic() - killed
    assert status == 502 and "lost connection with prefill instance" in text, text
    # Two misses 2 s apart (the first ping 2 s after the wait began), far inside the 60 s waiting timeout.
    assert 3.0 <= detected < 10.0, detected


def test_a_prefill_back_within_the_heartbeat_leaves_the_room_to_the_waiting_timeout() -> None:
    prefill, decode, bootstrap = _free_port(), _free_port(), _free_port()
    env = _env(heartbeat_interval="2", heartbeat_max_failure="3", waiting_timeout="8")
    with _worker("decode", decode, bootstrap, env), ThreadPoolExecutor(1) as pool:
        with _worker("prefill", prefill, bootstrap, env) as first:
            decode_leg = pool.submit(_post, decode, _body(bootstrap, 13))
            _wait_gauge(decode, "sglang:num_decode_transfer_queue_reqs", "1.0")
            first.send_signal(signal.SIGKILL)
            first.wait()
        # A restarted prefill answers the heartbeat but never heard of the room (as in SGLang).
        with _worker("prefill", prefill, bootstrap, env):
            status, text, elapsed = decode_leg.result()
    assert status == 502 and "timed out after 8 s" in text, text
    assert elapsed >= 8.0


def test_a_decode_leg_whose_client_left_stops_waiting() -> None:
    """smg drops the decode leg when the prefill leg fails; SGLang then aborts it, so does the engine.

    The leg must first be seen waiting (the transfer queue gauge at 1), so that a decode that never
    counted it cannot pass; then the client closes its connection and the gauge must return to 0.
    """
    prefill, decode, bootstrap = _free_port(), _free_port(), _free_port()
    env = _env(waiting_timeout="60")

    def queued() -> str:
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{decode}/metrics", timeout=5).read().decode()
        return _samples(metrics)["sglang:num_decode_transfer_queue_reqs"]

    def wait_for(value: str, why: str) -> None:
        deadline = time.monotonic() + 10
        while queued() != value:
            assert time.monotonic() < deadline, why
            time.sleep(0.05)

    with _worker("prefill", prefill, bootstrap, env), _worker("decode", decode, bootstrap, env):
        assert queued() == "0.0"
        client = http.client.HTTPConnection("127.0.0.1", decode, timeout=30)
        try:  # room 17 is never prefilled: the leg waits for its KV until the client leaves
            client.request(
                "POST", "/generate", json.dumps(_body(bootstrap, 17)), {"Content-Type": "application/json"}
            )
            wait_for("1.0", "the decode never counted the leg waiting for its room")
        finally:
            client.close()
        wait_for("0.0", "the abandoned decode leg still waits for its room")


def test_a_bad_variable_names_itself() -> None:
    env = {**os.environ, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "soon"}
    result = subprocess.run([WORKER, "--help"], env=env, capture_output=True, text=True, timeout=30,
                            check=False)  # fmt: skip
    assert result.returncode != 0 and "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL='soon'" in result.stderr
