"""The Hugging Face Hub side, through the real huggingface_hub client (pinned 2.4.0).

`HubSource` resolves a revision to its commit (`HfApi.model_info`), lists the repository tree
with each file's size, git blob id and LFS sha256 (`HfApi.list_repo_tree`), and fetches one
file into a partial file the caller owns (`get_hf_file_metadata` for the HEAD /resolve
headers, then `http_get` with resume from the partial's length, or `xet_get` when the Hub
serves the file from Xet storage and hf_xet is installed: the fast backend, which keeps
its own chunk cache so an interrupted transfer resumes too). Every Hub error becomes a
CheckpointError naming the variable to fix; the token never appears in any message.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pd_appliance.checkpoint.errors import CheckpointError

DEFAULT_ENDPOINT = "https://huggingface.co"
# Download calls are retried by huggingface_hub itself; these bound each request.
METADATA_TIMEOUT_S = 30.0


def configure_hub_environment(*, cache_home: Path | None, offline: bool, xet_high_performance: bool) -> None:
    """Set huggingface_hub's environment before it is first imported (it reads it at import).

    HF_HOME goes under the checkpoint's own partial folder, so neither a token stored in
    ~/.cache/huggingface nor the Xet chunk cache lives outside the checkpoint's disk; the
    token is only ever the one passed explicitly. Has no effect once huggingface_hub is
    imported (tests), which only matters for those defaults.
    """
    if "huggingface_hub" in sys.modules:
        return
    if cache_home is not None:
        os.environ["HF_HOME"] = str(cache_home)
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    if xet_high_performance:
        os.environ["HF_XET_HIGH_PERFORMANCE"] = "1"


def transfer_backend() -> str:
    """The backend for Xet-stored files: hf_xet (fast, parallel, chunk-cached) when importable, else http."""
    from huggingface_hub.utils._runtime import is_xet_available

    return "hf_xet" if is_xet_available() else "http"


@dataclass(frozen=True)
class RemoteFile:
    """A file of the repository at one commit, as the Hub's tree API describes it."""

    path: str
    size: int
    git_blob_id: str
    lfs_sha256: str | None
    xet_hash: str | None


class HubSource:
    """One repository on one endpoint, with one token (or none)."""

    def __init__(self, repo_id: str, *, endpoint: str, token: str | None) -> None:
        from huggingface_hub import HfApi

        self.repo_id = repo_id
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self._token: str | bool = token or False
        self._api = HfApi(endpoint=self.endpoint, token=self._token, library_name="pd-appliance")
        self.files: dict[str, RemoteFile] = {}
        self.unselected: list[str] = []

    def resolve(self, revision: str) -> str:
        """The commit hash `revision` (a branch, tag or commit) names on the Hub."""
        try:
            info = self._api.model_info(self.repo_id, revision=revision, timeout=METADATA_TIMEOUT_S)
        except Exception as err:
            raise self.translate(err, revision=revision) from None
        if not info.sha:
            raise CheckpointError(
                f"{self.endpoint} returned no commit for {self.repo_id}@{revision}; it does not behave like"
                " the Hugging Face Hub. Fix: point checkpoint_hf_endpoint at the Hub or a Hub-compatible"
                " mirror."
            )
        return str(info.sha)

    def list_files(
        self, commit: str, *, allow_patterns: list[str] | None, ignore_patterns: list[str] | None
    ) -> tuple[list[RemoteFile], list[str]]:
        """The files at `commit` the patterns select (snapshot_download's filter), and those they leave out.

        The selected files are also kept in `self.files` for `fetch`.
        """
        from huggingface_hub.hf_api import RepoFile
        from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]  # lazily exported

        try:
            entries = [
                entry
                for entry in self._api.list_repo_tree(self.repo_id, revision=commit, recursive=True)
                if isinstance(entry, RepoFile)
            ]
        except Exception as err:
            raise self.translate(err, revision=commit) from None
        selected = set(
            filter_repo_objects(
                [entry.path for entry in entries],
                allow_patterns=allow_patterns,
                ignore_patterns=ignore_patterns,
            )
        )
        chosen = [
            RemoteFile(
                path=entry.path,
                size=int(entry.size),
                git_blob_id=str(entry.blob_id),
                lfs_sha256=entry.lfs.sha256 if entry.lfs is not None else None,
                xet_hash=entry.xet_hash,
            )
            for entry in entries
            if entry.path in selected
        ]
        self.files = {f.path: f for f in chosen}
        return chosen, sorted(entry.path for entry in entries if entry.path not in selected)

    def fetch(self, remote: RemoteFile, commit: str, partial: Path) -> None:
        """Bring `remote` at `commit` into `partial`, resuming from what `partial` already holds."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.file_download import http_get, xet_get
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # lazily exported
        from huggingface_hub.utils._runtime import is_xet_available

        url = hf_hub_url(self.repo_id, remote.path, revision=commit, endpoint=self.endpoint)
        try:
            meta = get_hf_file_metadata(
                url, token=self._token, endpoint=self.endpoint, timeout=METADATA_TIMEOUT_S
            )
            self._check_metadata(remote, commit, meta)
            headers = build_hf_headers(token=self._token, library_name="pd-appliance")
            if meta.xet_file_data is not None and is_xet_available():
                partial.unlink(missing_ok=True)
                xet_get(
                    incomplete_path=partial,
                    xet_file_data=meta.xet_file_data,
                    headers=headers,
                    expected_size=remote.size,
                    displayed_filename=remote.path,
                )
                return
            location = meta.location or url
            if urlsplit(location).netloc != urlsplit(url).netloc:
                # A signed CDN URL: the Hub's token must not leave the Hub (huggingface_hub does the same).
                headers.pop("authorization", None)
            resume = partial.stat().st_size if partial.exists() else 0
            if resume > remote.size:
                partial.unlink()
                resume = 0
            with partial.open("ab") as handle:
                http_get(location, handle, resume_size=resume, headers=headers, expected_size=remote.size)
                handle.flush()
                os.fsync(handle.fileno())
        except CheckpointError:
            raise
        except Exception as err:
            raise self.translate(err, revision=commit, path=remote.path) from None

    def _check_metadata(self, remote: RemoteFile, commit: str, meta: Any) -> None:
        expected_etag = remote.lfs_sha256 or remote.git_blob_id
        problems = []
        if meta.commit_hash and meta.commit_hash != commit:
            problems.append(f"commit {meta.commit_hash} instead of {commit}")
        if meta.size is not None and meta.size != remote.size:
            problems.append(f"size {meta.size} instead of {remote.size}")
        if meta.etag and meta.etag != expected_etag:
            problems.append(f"etag {meta.etag} instead of {expected_etag}")
        if problems:
            raise CheckpointError(
                f"{self.endpoint} serves {remote.path} inconsistently with its own tree listing ("
                + ", ".join(problems)
                + "). Fix: if checkpoint_hf_endpoint is a mirror, re-sync it; otherwise retry later."
            )

    def translate(self, err: BaseException, *, revision: str, path: str | None = None) -> CheckpointError:
        """A Hub or network error as a CheckpointError that names the variable to fix."""
        import httpx2
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = f"{self.repo_id}@{revision}" + (f" file {path}" if path else "")
        status = getattr(getattr(err, "response", None), "status_code", None)
        server_message = ""
        if isinstance(err, HfHubHTTPError):
            server_message = err.server_message or ""
        if isinstance(err, GatedRepoError):
            text = (
                f"{self.repo_id} is gated on {self.endpoint}. Fix: accept its terms on the Hub with the"
                " account that owns checkpoint_hf_token, and set checkpoint_hf_token to that account's read"
                " token."
            )
        elif status == 401 and "Invalid credentials" in (server_message or str(err)):
            text = (
                f"{self.endpoint} rejected checkpoint_hf_token (HTTP 401, invalid credentials) for {where}."
                " Fix: set checkpoint_hf_token to a valid read token"
                " (https://huggingface.co/settings/tokens), or leave it empty for a public repository."
            )
        elif isinstance(err, RevisionNotFoundError):
            text = (
                f"Revision {revision!r} does not exist in {self.repo_id} on {self.endpoint}. Fix:"
                " checkpoint_revision."
            )
        elif isinstance(err, RemoteEntryNotFoundError):
            text = (
                f"{where} is listed but not served by {self.endpoint}. Fix: re-sync the mirror, or retry"
                " later."
            )
        elif isinstance(err, RepositoryNotFoundError):
            token_hint = (
                "checkpoint_hf_token may lack access to it"
                if self._token
                else "set checkpoint_hf_token if it is private"
            )
            text = (
                f"Repository {self.repo_id} not found on {self.endpoint} ({token_hint}). Fix:"
                " checkpoint_repo_id, checkpoint_hf_endpoint or checkpoint_hf_token."
            )
        elif status == 403:
            text = (
                f"{self.endpoint} refused {where} (HTTP 403). Fix: give the account of checkpoint_hf_token"
                " read access."
            )
        elif isinstance(err, httpx2.ConnectError | httpx2.TimeoutException | httpx2.NetworkError):
            text = (
                f"Cannot reach {self.endpoint} for {where} ({type(err).__name__}: {err}). Fix: set"
                " checkpoint_hf_endpoint to a reachable Hub mirror, or pre-seed checkpoint_dir and set"
                " checkpoint_offline: true."
            )
        elif isinstance(err, HfHubHTTPError):
            text = (
                f"{self.endpoint} failed on {where} (HTTP {status}: {server_message or err}). Retry, or"
                " check the mirror."
            )
        else:
            text = f"Fetching {where} from {self.endpoint} failed: {type(err).__name__}: {err}"
        return CheckpointError(self.redact(text))

    def redact(self, text: str) -> str:
        """Last line of defence: no message leaves this class with the token in it."""
        if isinstance(self._token, str) and self._token:
            text = text.replace(self._token, "***")
        return text
