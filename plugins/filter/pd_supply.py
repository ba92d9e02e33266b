"""Supply-chain filters: thin wrappers over pd_appliance.supply (locks, Python choice, sources, keyrings).

They run on the controller, so preflight and the driver stage can use them before any tools venv exists.
"""

from __future__ import annotations

import base64
from typing import Any

from ansible.errors import AnsibleFilterError

from pd_appliance.supply import keyring, lock, pythons, sources


def pd_python_probe_script(_: Any = None) -> str:
    """The stdlib-only script the role and preflight run with a candidate interpreter."""
    return pythons.PROBE_SCRIPT


def pd_sglang_python_choice(
    probe_stdout: str | None, host: str, manifest: dict[str, Any], source: str, uv_version: str
) -> dict[str, Any]:
    """{'ok': True, kind, version, lock, reason, probe} or {'ok': False, 'error': message}."""
    probe = pythons.parse_probe(probe_stdout)
    try:
        choice = pythons.choose(host, probe, manifest, source, str(uv_version))
    except pythons.PythonChoiceError as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True, "probe": probe or {}, **choice.as_dict()}


def pd_sglang_python_errors(
    probe_stdout: str | None, host: str, manifest: dict[str, Any], source: str, uv_version: str
) -> list[str]:
    """Preflight: why no Python can build the SGLang venv on this host (empty when one can)."""
    return pythons.python_errors(host, pythons.parse_probe(probe_stdout), manifest, source, str(uv_version))


def pd_source_url_errors(url: str, host: str, variable: str, covered_by: str = "") -> list[str]:
    """https/file, or plain http only where ``covered_by`` names the checksum that covers it."""
    return sources.url_errors(host, variable, url or "", covered_by)


def pd_sha256_errors(value: str, host: str, variable: str, url: str) -> list[str]:
    """A tarball's sha256 variable: 64 hex digits, or one message naming the variable and the URL."""
    return sources.sha256_errors(host, variable, value, url)


def pd_is_commit(ref: str) -> bool:
    """A full 40-hex git commit id."""
    return sources.is_commit(str(ref))


def pd_lock_render(text: str, names: list[str] | None = None, header: str = "") -> str:
    """The lock (or the named entries of it) as a hash-checking requirements file."""
    try:
        return lock.render(lock.parse_lock(text), names, header)
    except lock.LockError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def pd_lock_closure(text: str, roots: list[str], stop: list[str] | None = None) -> list[str]:
    """Names of the roots and what they pull in from the lock, not descending into ``stop``."""
    try:
        return lock.closure(lock.parse_lock(text), roots, stop or [])
    except lock.LockError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def pd_lock_hashes(text: str, name: str) -> list[str]:
    """The sha256 digests the lock admits for one package."""
    entries = lock.parse_lock(text)
    entry = entries.get(lock.canonicalize_name(name))
    if entry is None:
        raise AnsibleFilterError(f"{name} is not in the lock")
    return entry.hashes


def pd_lock_unsatisfied(text: str, names: list[str], installed: dict[str, str]) -> list[str]:
    """Names of the lock's entries the installed distributions do not hold at the locked version."""
    try:
        return lock.unsatisfied(lock.parse_lock(text), names, installed)
    except lock.LockError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def pd_lock_version(text: str, name: str) -> str:
    """The version the lock pins for one package."""
    entry = lock.parse_lock(text).get(lock.canonicalize_name(name))
    if entry is None:
        raise AnsibleFilterError(f"{name} is not in the lock")
    return entry.version


def pd_lock_replace(text: str, name: str, url: str, sha256: str) -> str:
    """The lock as a requirements file with one entry taken from a local file (``name @ url``),
    pinned to that file's sha256: the sglang wheel kept on the host (or built from git)."""
    entries = lock.parse_lock(text)
    key = lock.canonicalize_name(name)
    if key not in entries:
        raise AnsibleFilterError(f"{name} is not in the lock")
    rest = {k: v for k, v in entries.items() if k != key}
    return f"{key} @ {url} \\\n    --hash=sha256:{sha256}\n" + lock.render(rest)


def pd_deb_keyring_problems(content_b64: str, allowed: list[str]) -> list[str]:
    """'path: fingerprint' of every key in a keyring .deb that ``allowed`` does not list."""
    try:
        found = keyring.deb_keyring_fingerprints(base64.b64decode(content_b64))
    except keyring.KeyringError as exc:
        return [f"unreadable keyring package: {exc}"]
    return keyring.unexpected_keys(found, allowed)


def pd_keyring_problems(content_b64: str, path: str, allowed: list[str]) -> list[str]:
    """The same check on an installed keyring file."""
    try:
        found = {path: keyring.keyring_fingerprints(base64.b64decode(content_b64))}
    except keyring.KeyringError as exc:
        return [f"{path}: unreadable keyring: {exc}"]
    return keyring.unexpected_keys(found, allowed)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, object]:
        return {
            "pd_python_probe_script": pd_python_probe_script,
            "pd_sglang_python_choice": pd_sglang_python_choice,
            "pd_sglang_python_errors": pd_sglang_python_errors,
            "pd_source_url_errors": pd_source_url_errors,
            "pd_sha256_errors": pd_sha256_errors,
            "pd_is_commit": pd_is_commit,
            "pd_lock_render": pd_lock_render,
            "pd_lock_closure": pd_lock_closure,
            "pd_lock_hashes": pd_lock_hashes,
            "pd_lock_replace": pd_lock_replace,
            "pd_lock_version": pd_lock_version,
            "pd_lock_unsatisfied": pd_lock_unsatisfied,
            "pd_deb_keyring_problems": pd_deb_keyring_problems,
            "pd_keyring_problems": pd_keyring_problems,
        }
