"""The program launcher: env files, secret flags, health gating, exec."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from pd_appliance.serving.launch import LaunchError, prepare, read_env_file, wait_for


def test_env_file_and_secret_arg(tmp_path) -> None:
    env_file = tmp_path / "router.env"
    env_file.write_text("# comment\nHF_TOKEN=hf_a=b\nSERVING_ROUTER_API_KEY=k3y with space\n")
    command, env, _ = prepare(
        [f"--env-file={env_file}", "--secret-arg=--api-key=SERVING_ROUTER_API_KEY", "--", "smg", "launch"],
        {"PATH": "/bin"},
    )
    assert command == ["smg", "launch", "--api-key", "k3y with space"]
    assert env["HF_TOKEN"] == "hf_a=b" and "SERVING_ROUTER_API_KEY" not in env


def test_unset_secret_adds_no_flag(tmp_path) -> None:
    env_file = tmp_path / "e.env"
    env_file.write_text("")
    command, _, _ = prepare([f"--env-file={env_file}", "--secret-arg=--api-key=K", "--", "smg"], {})
    assert command == ["smg"]


def test_missing_env_file_says_who_writes_it(tmp_path) -> None:
    with pytest.raises(LaunchError, match="serving role writes it"):
        read_env_file(str(tmp_path / "absent.env"))


def test_malformed_env_file_names_the_line(tmp_path) -> None:
    bad = tmp_path / "bad.env"
    bad.write_text("OK=1\nnot a pair\n")
    with pytest.raises(LaunchError, match=r"bad.env:2"):
        read_env_file(str(bad))


class _Flaky(BaseHTTPRequestHandler):
    calls = 0

    def do_GET(self) -> None:
        type(self).calls += 1
        self.send_response(200 if type(self).calls >= 3 else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_wait_for_blocks_until_2xx_and_times_out() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/health"
        wait_for([url], timeout_s=10, interval_s=0.05, log=lambda _m: None)
        assert _Flaky.calls >= 3
    finally:
        server.shutdown()
    with pytest.raises(LaunchError, match=r"gave up after 0s waiting for http://127\.0\.0\.1:9/health"):
        wait_for(["http://127.0.0.1:9/health"], timeout_s=0.3, interval_s=0.05, log=lambda _m: None)


def test_launcher_execs_the_command_with_the_env(tmp_path) -> None:
    env_file = tmp_path / "p.env"
    env_file.write_text("HF_TOKEN=secret-token\n")
    code = "import os,sys; print(os.environ['HF_TOKEN'], sys.argv[1:])"
    out = subprocess.run(
        [sys.executable, "-m", "pd_appliance.serving.launch", f"--env-file={env_file}", "--",
         sys.executable, "-c", code, "x"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert out.stdout.strip() == "secret-token ['x']"
