"""The lab host image: cached by its inputs, and a bare server (what provision must install is absent)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "lab_host_image.sh"


def _docker_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the image is built with debootstrap"
    if shutil.which("docker") is None or shutil.which("debootstrap") is None:
        return "docker or debootstrap is missing (.ci/run installs docker.io and debootstrap)"
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "dockerd does not answer"
    return None


_SKIP = _docker_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


def build(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env or dict(os.environ),
    )


@pytest.fixture(scope="module")
def image() -> str:
    """The current image's reference (built once if missing: about a minute)."""
    result = build()
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_same_inputs_reuse_the_image(image: str) -> None:
    again = build()
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == image
    assert "building" not in again.stderr
    assert build("--check").stdout.strip() == image


def test_another_ca_bundle_is_another_image(image: str, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_text(Path("/etc/ssl/certs/ca-certificates.crt").read_text() + "\n")
    env = dict(os.environ, PDLAB_CA_BUNDLE=str(bundle))
    checked = build("--check", env=env)
    assert checked.returncode == 1, "an image for a different CA bundle must not exist yet"
    assert checked.stdout.strip() == "" and "building" not in checked.stderr


def in_image(image: str, script: str) -> str:
    """What `script` prints in a throw-away container of the image (its exit code is not asked)."""
    return subprocess.run(
        ["docker", "run", "--rm", "--entrypoint=sh", image, "-c", script],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def test_image_is_a_bare_lab_server(image: str) -> None:
    packages = in_image(
        image,
        "dpkg-query --show --showformat='${Package} ${db:Status-Status}\\n' "
        "systemd openssh-server sudo python3 python3-venv numactl 2>/dev/null",
    ).splitlines()
    for present in ("systemd", "openssh-server", "sudo", "python3"):
        assert f"{present} installed" in packages, packages
    # What the appliance must install itself is not there.
    assert "python3-venv installed" not in packages and "numactl installed" not in packages, packages
    assert "sudo" in in_image(image, "id -nG admin").split()
    assert in_image(image, "ls /etc/ssh/ssh_host_* 2>/dev/null") == "", (
        "host keys are made per container at first boot"
    )


def test_image_trusts_what_this_host_trusts_and_pip_uses_it(image: str) -> None:
    pem = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
    host = set(pem.findall(Path("/etc/ssl/certs/ca-certificates.crt").read_text()))
    inside = set(pem.findall(in_image(image, "cat /etc/ssl/certs/ca-certificates.crt")))
    assert host <= inside, f"{len(host - inside)} of this host's CA certificates are missing in the image"
    assert "cert = /etc/ssl/certs/ca-certificates.crt" in in_image(image, "cat /etc/pip.conf")
