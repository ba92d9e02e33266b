"""Which Python builds the SGLang venv on the lab OSes and CI's, from the real lock manifest."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sglang_testlib import ROOT, SGLANG_VERSION

from pd_appliance.supply import pythons, sources

MANIFEST = {
    **json.loads((ROOT / "files" / "locks" / f"sglang-{SGLANG_VERSION}" / "manifest.json").read_text()),
    "dir": "files/locks/sglang-0.5.23",
}


def probe(version: str, machine: str = "x86_64", glibc: str = "2.35") -> dict[str, object]:
    libc = ["glibc", glibc]
    return {"version": version, "machine": machine, "libc": libc, "executable": "/usr/bin/python3"}


@pytest.mark.parametrize(
    ("os_name", "version", "glibc", "kind", "chosen"),
    [
        ("Ubuntu 22.04", "3.10.12", "2.35", "uv", "3.12"),  # no cp310 sglang wheel
        ("Ubuntu 24.04", "3.12.3", "2.39", "host", "3.12"),
        ("Debian 12", "3.11.2", "2.36", "host", "3.11"),  # CI's containers
    ],
)
def test_lab_and_ci_oses(os_name: str, version: str, glibc: str, kind: str, chosen: str) -> None:
    choice = pythons.choose("gpu1", probe(version, glibc=glibc), MANIFEST, "auto", "3.12")
    assert (choice.kind, choice.version, choice.lock) == (kind, chosen, f"py{chosen}-x86_64.txt"), os_name


def test_host_only_names_the_fix() -> None:
    with pytest.raises(pythons.PythonChoiceError) as err:
        pythons.choose("gpu1", probe("3.10.12"), MANIFEST, "host", "3.12")
    msg = str(err.value)
    assert msg.startswith("gpu1: sglang_python is Python 3.10.12")
    assert "3.11, 3.12" in msg and "cp310" in msg and "sglang_python_source: uv" in msg


def test_missing_python_falls_back_to_uv_or_is_named() -> None:
    assert pythons.choose("gpu1", None, MANIFEST, "auto", "3.12").kind == "uv"
    with pytest.raises(pythons.PythonChoiceError, match="sglang_python does not run a Python 3"):
        pythons.choose("gpu1", None, MANIFEST, "host", "3.12")


def test_uv_version_without_a_lock_and_unknown_source() -> None:
    [msg] = pythons.python_errors("gpu1", probe("3.10.1"), MANIFEST, "auto", "3.13")
    assert msg == (
        "gpu1: sglang_uv_python_version='3.13' has no lock in files/locks/sglang-0.5.23; "
        "use one of 3.11, 3.12."
    )
    [msg] = pythons.python_errors("gpu1", probe("3.12.1"), MANIFEST, "conda", "3.12")
    assert "use one of auto, host, uv" in msg


def test_wrong_machine_and_old_glibc_are_refused() -> None:
    [arm] = pythons.python_errors("gpu1", probe("3.12.3", machine="aarch64"), MANIFEST, "auto", "3.12")
    assert "for x86_64, this host is aarch64" in arm and "--machine aarch64" in arm
    [old] = pythons.python_errors("gpu1", probe("3.11.2", glibc="2.31"), MANIFEST, "auto", "3.12")
    assert "glibc 2.31 is older than 2.34" in old


def test_the_probe_runs_on_this_python_with_the_stdlib_only() -> None:
    argv = [sys.executable, "-I", "-S", "-c", pythons.PROBE_SCRIPT]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    found = pythons.parse_probe(out.stdout)
    assert found is not None and found["version"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
    assert found["machine"] and found["executable"] == sys.executable
    assert pythons.parse_probe("") is None and pythons.parse_probe("Python 2 says hi") is None


@pytest.mark.parametrize(
    ("url", "covered", "ok"),
    [
        ("https://pypi.example/simple", "", True),
        ("file:///srv/python-builds", "", True),
        ("/srv/wheels", "", True),
        ("", "", True),
        ("http://mirror.example/simple", "the lock hashes", True),
        ("http://mirror.example/ucx.tar.gz", "", False),
        ("ftp://mirror.example/ucx.tar.gz", "", False),
        ("ftp://mirror.example/simple", "the lock hashes", False),
    ],
)
def test_source_rule(url: str, covered: str, ok: bool) -> None:
    errors = sources.url_errors("gpu1", "nixl_ucx_url", url, covered)
    assert (errors == []) is ok
    if not ok:
        assert errors[0].startswith(f"gpu1: nixl_ucx_url={url}") and "https://" in errors[0]


def test_commit_ids() -> None:
    assert sources.is_commit("a" * 40)
    assert not sources.is_commit("v0.5.23") and not sources.is_commit("g" * 40)
