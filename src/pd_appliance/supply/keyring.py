"""Fingerprints of the OpenPGP keys a keyring .deb ships (NVIDIA's cuda-keyring).

The nvidia_driver role checks them before the package is installed: the keyring is the trust anchor
of every later apt download from the CUDA repository, so a keyring fetched from a mirror must carry
exactly the key NVIDIA publishes. Pure Python on purpose: it runs as a filter on the controller,
before any tools venv exists and on hosts without gpg.

Formats: a .deb is an ar archive whose data.tar.{gz,xz,bz2} holds the files; a keyring is a
sequence of binary OpenPGP packets (RFC 4880 section 4.2) or its ASCII armour. A v4 primary key's
fingerprint is SHA-1 over 0x99, the two-byte body length and the body (RFC 4880 section 12.2).
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
from collections.abc import Iterator

PUBLIC_KEY = 6
PUBLIC_SUBKEY = 14
KEYRING_SUFFIXES = (".gpg", ".asc", ".pgp")


class KeyringError(ValueError):
    """Not a keyring .deb this module can read; the message says what was found."""


def ar_members(data: bytes) -> Iterator[tuple[str, bytes]]:
    """(name, content) of each member of a Unix ar archive (the .deb container)."""
    if not data.startswith(b"!<arch>\n"):
        raise KeyringError("not a .deb (no ar archive header)")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        start = pos + 60
        yield name, data[start : start + size]
        pos = start + size + (size % 2)


def deb_files(data: bytes) -> dict[str, bytes]:
    """Regular files of the .deb's data archive, by path without the leading './'."""
    for name, content in ar_members(data):
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise KeyringError("data.tar.zst: zstd-compressed .debs are not supported; NVIDIA ships xz")
            with tarfile.open(fileobj=io.BytesIO(content), mode="r:*") as tar:
                out = {}
                for member in tar.getmembers():
                    if member.isfile():
                        extracted = tar.extractfile(member)
                        if extracted is not None:
                            out[member.name.removeprefix("./")] = extracted.read()
                return out
    raise KeyringError("the .deb has no data.tar member")


def dearmor(data: bytes) -> bytes:
    """Binary packets from an ASCII-armoured key block (binary input is returned as is)."""
    if not data.lstrip().startswith(b"-----BEGIN PGP"):
        return data
    lines = data.decode("ascii").splitlines()
    body, started = [], False
    for line in lines:
        if line.startswith("-----BEGIN"):
            started = True
            continue
        if line.startswith("-----END"):
            break
        if started and line and ":" not in line and not line.startswith("="):
            body.append(line)
    return base64.b64decode("".join(body))


def packets(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(tag, body) of each OpenPGP packet, old and new header formats."""
    pos = 0
    while pos < len(data):
        ctb = data[pos]
        if not ctb & 0x80:
            raise KeyringError(f"not an OpenPGP packet at byte {pos}")
        if ctb & 0x40:  # new format
            tag = ctb & 0x3F
            first = data[pos + 1]
            if first < 192:
                length, head = first, 2
            elif first < 224:
                length, head = ((first - 192) << 8) + data[pos + 2] + 192, 3
            elif first == 255:
                length, head = int.from_bytes(data[pos + 2 : pos + 6], "big"), 6
            else:
                raise KeyringError("partial-length packets do not occur in keys")
        else:  # old format
            tag = (ctb >> 2) & 0x0F
            kind = ctb & 0x03
            if kind == 3:
                raise KeyringError("indeterminate-length packets do not occur in keys")
            size = 1 << kind
            length, head = int.from_bytes(data[pos + 1 : pos + 1 + size], "big"), 1 + size
        yield tag, data[pos + head : pos + head + length]
        pos += head + length


def fingerprint(body: bytes) -> str:
    """The fingerprint of a public key packet body (v4: SHA-1; v5/v6 are refused by name)."""
    if not body or body[0] != 4:
        raise KeyringError(f"OpenPGP key version {body[0] if body else '?'}: only v4 keys are supported")
    return (
        hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body, usedforsecurity=False).hexdigest().upper()
    )


def keyring_fingerprints(data: bytes) -> list[str]:
    """Primary-key fingerprints in a keyring (subkeys are bound to, and trusted through, these)."""
    return [fingerprint(body) for tag, body in packets(dearmor(data)) if tag == PUBLIC_KEY]


def _is_keyring(path: str) -> bool:
    in_keyrings = "/keyrings/" in f"/{path}" or path.startswith("etc/apt/trusted.gpg.d/")
    return in_keyrings and path.endswith(KEYRING_SUFFIXES)


def deb_keyring_fingerprints(deb: bytes) -> dict[str, list[str]]:
    """Fingerprints of every keyring file the .deb installs, by installed path."""
    found = {
        "/" + path: keyring_fingerprints(content)
        for path, content in deb_files(deb).items()
        if _is_keyring(path)
    }
    if not found:
        raise KeyringError(
            "the .deb installs no keyring (no *.gpg under a keyrings/ or trusted.gpg.d/ directory)"
        )
    return found


def unexpected_keys(found: dict[str, list[str]], allowed: list[str]) -> list[str]:
    """'path: fingerprint' for every key not in ``allowed`` (spaces and case ignored), and a line
    for a keyring that holds no key at all."""
    normal = {a.replace(" ", "").upper() for a in allowed}
    out = []
    for path, fingerprints in sorted(found.items()):
        if not fingerprints:
            out.append(f"{path}: no key")
        out.extend(f"{path}: {fp}" for fp in fingerprints if fp not in normal)
    return out
