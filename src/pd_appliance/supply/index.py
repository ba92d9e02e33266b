"""Prove a hashed lock against its source without installing it.

The stand-in path (sglang_install_cuda_stack: false) cannot install the CUDA stack, and neither
``uv pip install --dry-run`` nor ``pip install --dry-run`` compares a lock's hashes with anything
(uv 0.13.9 dry-runs a lock whose hashes were replaced by zeros without a word). This check does
what an install would: for every locked package it asks the index (PEP 691 JSON, or the PEP 503
HTML page a mirror serves) or reads the wheelhouse, picks the files an installer could take for the
target Python on this machine, and requires the sha256 of at least one of them to be among the
lock's hashes. Nothing is downloaded but the index pages.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from packaging.tags import Tag, compatible_tags, cpython_tags, platform_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from pd_appliance.supply.lock import LockEntry

PYPI = "https://pypi.org/simple/"
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
_SHA256 = re.compile(r"sha256=([0-9a-f]{64})")


@dataclass(frozen=True)
class IndexFile:
    """One distribution file an index or wheelhouse offers."""

    filename: str
    sha256: str | None


def target_tags(python_version: str) -> set[Tag]:
    """Wheel tags a CPython ``python_version`` on this machine installs (this host's platform tags)."""
    major, minor = (int(p) for p in python_version.split(".")[:2])
    platforms = list(platform_tags())
    return set(cpython_tags((major, minor), platforms=platforms)) | set(
        compatible_tags((major, minor), f"cp{major}{minor}", platforms)
    )


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


# Attempts for one index page, and the first pause (doubled each time): a transient failure (a DNS
# lookup that timed out, a reset connection, a 5xx or 429) is retried as pip (5 retries) and uv (3)
# retry theirs; 4 attempts span about 7 s. Seen in CI: 4 of 209 lookups failed one name resolution.
INDEX_ATTEMPTS = 4
INDEX_BACKOFF_S = 1.0


def transient(exc: OSError) -> bool:
    """True for a failure worth another attempt; an HTTP 4xx other than 429 is an answer, not a glitch."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code == 429 or exc.code >= 500
    return True


def _fetch(request: urllib.request.Request, timeout: float) -> tuple[bytes, str]:
    pause = INDEX_BACKOFF_S
    for attempt in range(1, INDEX_ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read(), response.headers.get("Content-Type", "")
        except OSError as exc:
            if attempt == INDEX_ATTEMPTS or not transient(exc):
                raise
            time.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable")


def index_files(index_url: str, name: str, timeout: float = 60.0) -> list[IndexFile]:
    """Files the index lists for a project, with the sha256 the index publishes for each."""
    url = urljoin(index_url.rstrip("/") + "/", f"{name}/")
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT, "User-Agent": "pd-appliance"})
    body, kind = _fetch(request, timeout)
    if "json" in kind:
        return [
            IndexFile(f["filename"], f.get("hashes", {}).get("sha256")) for f in json.loads(body)["files"]
        ]
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    out = []
    for link in parser.links:
        path, _, fragment = link.partition("#")
        digest = _SHA256.search(fragment)
        out.append(IndexFile(urlsplit(path).path.rsplit("/", 1)[-1], digest.group(1) if digest else None))
    return out


def wheelhouse_files(directory: Path, name: str) -> list[IndexFile]:
    """Wheels of a project in a wheelhouse directory, hashed (the wheelhouse publishes no digests)."""
    out = []
    for path in sorted(directory.glob("*.whl")):
        try:
            dist, *_ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if dist == canonicalize_name(name):
            digest = hashlib.sha256()
            with path.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            out.append(IndexFile(path.name, digest.hexdigest()))
    return out


def installable(files: Iterable[IndexFile], version: str, tags: set[Tag]) -> list[IndexFile]:
    """The wheels of ``version`` whose tags the target accepts (the locks are wheel-only)."""
    out = []
    for f in files:
        try:
            _, wheel_version, _, wheel_tags = parse_wheel_filename(f.filename)
        except InvalidWheelFilename:
            continue
        if str(wheel_version) == version and wheel_tags & tags:
            out.append(f)
    return out


def entry_problem(entry: LockEntry, files: list[IndexFile], tags: set[Tag], source: str) -> str | None:
    """None when the source serves a file of this entry that the lock's hashes admit."""
    candidates = installable(files, entry.version, tags)
    if not candidates:
        return f"{entry.name}=={entry.version}: {source} has no wheel of it for this Python and machine"
    if not any(f.sha256 in entry.hashes for f in candidates if f.sha256):
        if all(f.sha256 is None for f in candidates):
            return f"{entry.name}=={entry.version}: {source} publishes no sha256 for its files"
        names = ", ".join(f.filename for f in candidates)
        return f"{entry.name}=={entry.version}: no sha256 in the lock matches {names} from {source}"
    return None


def check(
    entries: Mapping[str, LockEntry],
    python_version: str,
    index_urls: Iterable[str] = (PYPI,),
    wheelhouse: Path | None = None,
    workers: int = 8,
) -> list[str]:
    """Problems with the lock against the first source that lists each package (empty: all good)."""
    tags = target_tags(python_version)
    urls = [u for u in index_urls if u] or [PYPI]

    def one(entry: LockEntry) -> str | None:
        if wheelhouse is not None:
            return entry_problem(entry, wheelhouse_files(wheelhouse, entry.name), tags, str(wheelhouse))
        last = None
        for url in urls:
            try:
                files = index_files(url, entry.name)
            except OSError as exc:
                last = f"{entry.name}=={entry.version}: {url} did not answer ({exc})"
                continue
            problem = entry_problem(entry, files, tags, url)
            if problem is None:
                return None
            last = problem
        return last

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(one, [entries[n] for n in sorted(entries)]))
    return [r for r in results if r]
