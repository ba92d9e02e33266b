"""The supply chain's source checks: keyring fingerprints of a real .deb, and a lock proven against a
source's published (or computed) sha256 digests."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from pd_appliance.supply import index, keyring, lock

NVIDIA_CUDA_KEY = "EB693B3035CD5710E231E123A4B469963BF863CC"


def _gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", *args], check=True, capture_output=True
    ).stdout


@pytest.fixture(scope="module")
def keyring_deb(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A cuda-keyring-shaped .deb built by dpkg-deb around two fresh gpg keys, and gpg's own fingerprints."""
    if not (shutil.which("gpg") and shutil.which("dpkg-deb")):
        pytest.skip("gpg and dpkg-deb are needed (CI installs gnupg; dpkg-deb is Debian's)")
    from pd_standins.apt_repo import build_deb, keyring_package

    work = tmp_path_factory.mktemp("keyring")
    home = Path(tempfile.mkdtemp(prefix="gpg-", dir="/tmp"))  # gpg's socket path must stay short
    home.chmod(0o700)
    try:
        for uid in ("one <one@invalid>", "two <two@invalid>"):
            _gpg(home, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        exported = _gpg(home, "--export")
        colons = _gpg(home, "--with-colons", "--list-keys").decode()
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    # The fingerprint line that follows each "pub" line is the primary key's (subkeys follow "sub").
    lines = colons.splitlines()
    primaries = [lines[i + 1].split(":")[9] for i, ln in enumerate(lines) if ln.startswith("pub:")]
    assert len(primaries) == 2
    deb = build_deb(keyring_package(exported, "ubuntu2404"), work, work / "build")
    return deb, primaries


def test_fingerprints_of_a_real_deb_match_gpg(keyring_deb: tuple[Path, list[str]]) -> None:
    deb, primaries = keyring_deb
    found = keyring.deb_keyring_fingerprints(deb.read_bytes())
    assert found == {"/usr/share/keyrings/cuda-archive-keyring.gpg": primaries}
    assert keyring.unexpected_keys(found, primaries) == []
    assert keyring.unexpected_keys(found, [primaries[0], NVIDIA_CUDA_KEY]) == [
        f"/usr/share/keyrings/cuda-archive-keyring.gpg: {primaries[1]}"
    ]


def test_the_filter_refuses_a_foreign_key_and_garbage(keyring_deb: tuple[Path, list[str]]) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "filter"))
    from pd_supply import pd_deb_keyring_problems

    deb, primaries = keyring_deb
    content = base64.b64encode(deb.read_bytes()).decode()
    spaced = [" ".join(fp[i : i + 4] for i in range(0, 40, 4)).lower() for fp in primaries]
    assert pd_deb_keyring_problems(content, spaced) == []  # gpg's spaced, lower-case spelling is fine
    assert len(pd_deb_keyring_problems(content, [NVIDIA_CUDA_KEY])) == 2
    [garbage] = pd_deb_keyring_problems(
        base64.b64encode(b"<html>mirror error page</html>").decode(), primaries
    )
    assert "unreadable keyring package: not a .deb" in garbage


def _v4_key_body(seed: bytes) -> bytes:
    return b"\x04" + b"\x60\x00\x00\x00" + b"\x16" + seed  # version 4, creation time, EdDSA, key material


def test_packet_formats_and_armour() -> None:
    body = _v4_key_body(b"k" * 40)
    expected = hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()
    new_format = bytes([0xC0 | 6, len(body)]) + body
    old_format = bytes([0x80 | (6 << 2) | 1]) + len(body).to_bytes(2, "big") + body
    user_id = bytes([0xC0 | 13, 3]) + b"uid"
    assert keyring.keyring_fingerprints(new_format + user_id) == [expected]
    assert keyring.keyring_fingerprints(old_format) == [expected]
    armoured = (
        b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nComment: test\n\n"
        + base64.encodebytes(new_format)
        + b"=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n"
    )
    assert keyring.keyring_fingerprints(armoured) == [expected]
    with pytest.raises(keyring.KeyringError, match="only v4"):
        keyring.keyring_fingerprints(bytes([0xC0 | 6, 3]) + b"\x06ab")


def _lock_of(name: str, version: str, *digests: str) -> lock.LockEntry:
    return lock.LockEntry(name, version, list(digests))


def test_index_entry_needs_a_wheel_for_the_target_with_a_locked_hash() -> None:
    tags = index.target_tags("3.11")
    files = [
        index.IndexFile("demo-1.0.tar.gz", "a" * 64),
        index.IndexFile("demo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "b" * 64),
        index.IndexFile("demo-1.0-py3-none-any.whl", "c" * 64),
    ]
    assert index.entry_problem(_lock_of("demo", "1.0", "c" * 64), files, tags, "idx") is None
    assert "no sha256 in the lock matches demo-1.0-py3-none-any.whl" in str(
        index.entry_problem(_lock_of("demo", "1.0", "a" * 64, "b" * 64), files, tags, "idx")
    )
    assert "has no wheel of it" in str(
        index.entry_problem(_lock_of("demo", "2.0", "c" * 64), files, tags, "idx")
    )
    unhashed = [index.IndexFile("demo-1.0-py3-none-any.whl", None)]
    assert "publishes no sha256" in str(
        index.entry_problem(_lock_of("demo", "1.0", "c" * 64), unhashed, tags, "i")
    )


def test_wheelhouse_is_hashed_for_real(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a zip, but bytes with a digest")
    (tmp_path / "other-1.0-py3-none-any.whl").write_bytes(b"x")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    good = {"demo": _lock_of("demo", "1.0", digest)}
    bad = {"demo": _lock_of("demo", "1.0", "0" * 64)}
    assert index.check(good, "3.11", wheelhouse=tmp_path) == []
    [problem] = index.check(bad, "3.11", wheelhouse=tmp_path)
    assert problem.startswith("demo==1.0: no sha256 in the lock matches demo-1.0-py3-none-any.whl")


def _flaky_index(failures: int, fail_code: int):
    """A local simple index that answers `fail_code` `failures` times, then lists one wheel."""
    import http.server
    import threading

    hits: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(1)
            if len(hits) <= failures:
                self.send_error(fail_code)
                return
            body = b'<a href="demo-1.0-py3-none-any.whl#sha256=' + b"ab" * 32 + b'">demo</a>'
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hits


def test_index_lookup_retries_a_transient_failure_and_not_a_missing_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pd_appliance.supply import index

    monkeypatch.setattr(index, "INDEX_BACKOFF_S", 0.01)
    server, hits = _flaky_index(2, 503)
    try:
        files = index.index_files(f"http://127.0.0.1:{server.server_address[1]}/simple/", "demo")
    finally:
        server.shutdown()
    assert [f.filename for f in files] == ["demo-1.0-py3-none-any.whl"] and len(hits) == 3

    server, hits = _flaky_index(10, 404)
    try:
        with pytest.raises(OSError, match="404"):
            index.index_files(f"http://127.0.0.1:{server.server_address[1]}/simple/", "demo")
    finally:
        server.shutdown()
    assert len(hits) == 1  # an answer, not a glitch: asked once
