"""Where packages and sources may come from.

A source is trusted by its transport (https, or a local file) or by a checksum that covers everything
it serves (the lock's sha256 hashes for a package index, uv's built-in sha256 for its Python
downloads, a sha256 variable for a tarball, a commit id for git). Plain http with nothing checking the
bytes is refused before anything is installed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

SAFE_SCHEMES = ("https", "file")


def url_errors(host: str, variable: str, url: str, covered_by: str = "") -> list[str]:
    """One message when ``url`` is neither https/file nor covered by a checksum (``covered_by`` says
    which, empty when none); nothing for an empty (unused) URL."""
    if not url:
        return []
    scheme = urlsplit(url).scheme.lower()
    if scheme in SAFE_SCHEMES or (scheme == "" and url.startswith("/")):
        return []
    if scheme == "http" and covered_by:
        return []
    if scheme != "http":
        kind = f"{scheme}://" if scheme else "a bare name"
        return [f"{host}: {variable}={url}: use an https:// (or file://) URL; {kind} is not one."]
    return [
        f"{host}: {variable}={url} is {scheme or 'not a URL'}: use an https:// (or file://) URL; nothing "
        "checks the bytes it serves (a sha256 variable or a hashed lock would)."
    ]


def sha256_errors(host: str, variable: str, value: str, url: str) -> list[str]:
    """A tarball's sha256 variable must be 64 hex digits: unset, nothing would check the bytes unpacked
    and built as root (a mirror, or a compromised release page, could serve anything)."""
    text = str(value or "").strip()
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return []
    got = "is empty" if not text else f"={text[:80]} is not one"
    return [
        f"{host}: {variable} must be the sha256 of {url} (64 hex digits; {variable} {got}). Run sha256sum on "
        f"the tarball you qualified and set {variable}."
    ]


def is_commit(ref: str) -> bool:
    """A full git commit id (its content is fixed by the id, whatever the transport)."""
    return len(ref) == 40 and all(c in "0123456789abcdef" for c in ref.lower())
