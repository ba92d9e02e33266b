"""The program launcher: env files, secret flags, health gating, exec."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from pd_appliance.serving.launch import LaunchError, prepare, read_env_file, wait_for

SHOW = """import json, os, sys
print(json.dumps({"argv": sys.argv, "cmdline": open("/proc/self/cmdline").read().split("\\0"),
                  "env": sorted(k for k in os.environ if k.startswith(("SERVING_", "PD_LAUNCH")))}))
"""


def _show_script(path: Path) -> Path:
    """An executable Python script at `path` that prints what it was started with (SHOW)."""
    path.write_text(f"#!{sys.executable}\n{SHOW}")
    path.chmod(0o755)
    return path


def _run_launcher(*args: str, cwd: Path | None = None) -> dict:
    out = subprocess.run([sys.executable, "-m", "pd_appliance.serving.launch", *args], cwd=cwd,
                         capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return json.loads(out.stdout)


def test_secret_flag_reaches_a_console_script_in_process_never_its_command_line(tmp_path) -> None:
    env_file = tmp_path / "router.env"
    env_file.write_text("# comment\nHF_TOKEN=hf_a=b\nSERVING_ROUTER_API_KEY=k3y-with-s9ace\n")
    script = _show_script(tmp_path / "smg")
    seen = _run_launcher(f"--env-file={env_file}", "--secret-arg=--api-key=SERVING_ROUTER_API_KEY", "--",
                         str(script), "launch", "--port", "1")  # fmt: skip
    assert seen["argv"] == [str(script), "launch", "--port", "1", "--api-key", "k3y-with-s9ace"]
    assert not any("k3y-with-s9ace" in word for word in seen["cmdline"]), seen["cmdline"]
    assert seen["env"] == []  # the variable and the shim's own are gone before the program runs


def test_secret_flag_reaches_a_python_module_in_process(tmp_path) -> None:
    env_file = tmp_path / "w.env"
    env_file.write_text("SERVING_ROUTER_API_KEY=worker-key-42\n")
    (tmp_path / "showargs.py").write_text(SHOW)
    seen = _run_launcher(
        f"--env-file={env_file}",
        "--secret-arg=--api-key=SERVING_ROUTER_API_KEY",
        "--",
        sys.executable,
        "-m",
        "showargs",
        "--host",
        "h",
        cwd=tmp_path,  # python -c puts the working directory on sys.path
    )
    assert seen["argv"][1:] == ["--host", "h", "--api-key", "worker-key-42"]
    assert not any("worker-key-42" in word for word in seen["cmdline"])


def test_secret_flag_reaches_a_python_module_under_numactl(tmp_path) -> None:
    # What the serving role renders for a worker: launcher -- numactl <binding> -- python -m sglang...
    # (numactl: scripts/system-packages.sh)
    env_file = tmp_path / "w.env"
    env_file.write_text("SERVING_ROUTER_API_KEY=numa-key-7\n")
    (tmp_path / "showargs.py").write_text(SHOW)
    seen = _run_launcher(f"--env-file={env_file}", "--secret-arg=--api-key=SERVING_ROUTER_API_KEY", "--",
                         "/usr/bin/numactl", "--cpunodebind=0", "--membind=0", "--",
                         sys.executable, "-m", "showargs", "--port", "1", cwd=tmp_path)  # fmt: skip
    assert seen["argv"][1:] == ["--port", "1", "--api-key", "numa-key-7"]
    assert not any("numa-key-7" in word for word in seen["cmdline"]), seen["cmdline"]
    assert seen["env"] == []
    with pytest.raises(LaunchError, match="no program after its --"):
        prepare([f"--env-file={env_file}", "--secret-arg=--api-key=K", "--", "numactl", "-N0", "--"], {})


def test_unset_secret_adds_no_flag_and_a_non_python_program_is_refused(tmp_path) -> None:
    env_file = tmp_path / "e.env"
    env_file.write_text("")
    script = _show_script(tmp_path / "prog")
    assert _run_launcher(f"--env-file={env_file}", "--secret-arg=--api-key=K", "--", str(script))["argv"] == [
        str(script)
    ]
    with pytest.raises(LaunchError, match="not a Python program"):
        prepare([f"--env-file={env_file}", "--secret-arg=--api-key=K", "--", "/bin/true"], {})


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
