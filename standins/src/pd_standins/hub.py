"""The rehearsal hub: a stand-in for the Hugging Face Hub, on loopback, for rehearsals and tests.

The Hub cannot be reached from a rehearsal (or CI), so this serves one repository from a local
folder through the few endpoints huggingface_hub 2.4.0 calls to download it, with the same
headers and error codes as the Hub (read from huggingface_hub's source):

- GET  /api/models/{repo_id}[/revision/{rev}]     model info; `sha` is the commit
- GET  /api/models/{repo_id}/tree/{rev}[/{path}]  tree, `?recursive=&expand=`, Link pagination; files
                                                  carry oid (git blob id), size, lfs{oid,size,pointerSize}
- POST /api/models/{repo_id}/paths-info/{rev}     the same entries for the given `paths`
- HEAD/GET /{repo_id}/resolve/{rev}/{path}        X-Repo-Commit, ETag, X-Linked-Etag/X-Linked-Size for
                                                  LFS files, Content-Length, Range requests (206)
- errors: 401 + X-Error-Message "Invalid credentials in Authorization header" for a wrong token,
  404 + X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound.

Every response says what it is (`Server` and `X-PD-Rehearsal-Hub` headers, a `pd_rehearsal_hub`
field in model info) and every log line starts with "rehearsal hub (stand-in for the Hugging
Face Hub)". The commit id is derived from the content, so the same folder always serves the same
commit. `generate` writes the tiny checkpoint a rehearsal serves: real safetensors shards
(written here by hand, to the format's spec, so the tools venv needs neither numpy nor
safetensors), the shard index, a config.json shaped like DeepSeek-V4-Flash-NVFP4's, and a small
byte-level BPE tokenizer.json built here with the `tokenizers` library (nothing from the Hub), so
validation measures prompts in tokens and the rehearsal engine counts them with the same file.

Run: python -m pd_standins.hub {generate,serve,start,stop} --help
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

LABEL = "rehearsal hub (stand-in for the Hugging Face Hub)"
SERVER_HEADER = "pd-appliance-rehearsal-hub (stand-in for the Hugging Face Hub)"
log = logging.getLogger("pd_standins.hub")

# Files the real Hub stores in LFS (its default .gitattributes), the rest are plain git blobs.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".model")


# --------------------------------------------------------------------------- the generated checkpoint


def safetensors_bytes(
    tensors: Sequence[tuple[str, str, list[int], bytes]], metadata: dict[str, str]
) -> bytes:
    """Serialize tensors (name, dtype, shape, raw bytes) in the safetensors format, 8-byte aligned."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(data for *_, data in tensors)


# The tokenizer's whole words: common English (what pd-bench's synthetic prompts are made of), the
# rehearsal engine's filler and the validation probe. Any other text still encodes, byte by byte.
_TOKENIZER_WORD_TEXT = """
the of and to in is was for on that with as by at from his her an which have are were be this had
not but one they their all been has when who will more no if out so said what up its about into than
them can only other new some could time these two may then do first any my now such like our over
man me even most made after also did many before must through back years where much your way well
down should because each just those people how too little state good very make world still own see
men work long get here between both life being under never a it he she we you i or there would
simulated token rehearsal filler pd sim worker model ran text deterministic placeholder output
The capital France Paris canned engine answer
"""
TOKENIZER_WORDS = tuple(_TOKENIZER_WORD_TEXT.split())
BOS_TOKEN = "<|begin_of_sentence|>"
EOS_TOKEN = "<|end_of_sentence|>"


def rehearsal_tokenizer_json() -> bytes:
    """A byte-level BPE tokenizer.json, built with the `tokenizers` library from fixed merges.

    No training (which could differ between runs): the vocabulary is the 256 byte symbols, then
    every left-to-right prefix of each word with its leading space ("Ġthe"), then of each bare
    word. The space-led merges rank first, so " word" is one token for every listed word; other
    text falls back to smaller pieces and always encodes. The same inputs give the same bytes.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []

    def add(word: str) -> None:
        piece = word[0]
        for symbol in word[1:]:
            if piece + symbol not in vocab:
                merges.append((piece, symbol))
                vocab[piece + symbol] = len(vocab)
            piece += symbol

    for word in TOKENIZER_WORDS:
        add("Ġ" + word)
    for word in TOKENIZER_WORDS:
        add(word)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(BOS_TOKEN, special=True), AddedToken(EOS_TOKEN, special=True)])
    return (tokenizer.to_str(pretty=True) + "\n").encode()


def rehearsal_checkpoint_files(
    layers: int = 2, experts: int = 4, hidden: int = 256, revision: int = 1
) -> dict[str, bytes]:
    """The tiny NVFP4-shaped checkpoint: one shard per layer plus embeddings, an index, a config and
    the tokenizer (tokenizer.json, tokenizer_config.json).

    Routed experts are packed FP4 (U8, two values a byte) with FP8 block scales, the rest BF16,
    as in the NVFP4 release; contents are seeded pseudo-random bytes, so every run is identical.
    The embedding and the LM head have one row per token of the tokenizer (config's vocab_size).
    `revision` > 1 is a later commit of the same repository: the same shards, another config.json
    and README.md (what a re-published config looks like), so it has its own commit id.
    """
    rng = random.Random(20260501)
    inter = hidden // 2
    tokenizer_json = rehearsal_tokenizer_json()
    vocab_size = _vocab_size(tokenizer_json)
    rows_bytes = vocab_size * hidden * 2
    shards: list[list[tuple[str, str, list[int], bytes]]] = []
    shards.append(
        [
            ("model.embed_tokens.weight", "BF16", [vocab_size, hidden], rng.randbytes(rows_bytes)),
            ("model.norm.weight", "BF16", [hidden], rng.randbytes(hidden * 2)),
            ("lm_head.weight", "BF16", [vocab_size, hidden], rng.randbytes(rows_bytes)),
        ]
    )
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        tensors = [
            (f"{prefix}.input_layernorm.weight", "BF16", [hidden], rng.randbytes(hidden * 2)),
            (
                f"{prefix}.self_attn.q_proj.weight",
                "BF16",
                [hidden, hidden],
                rng.randbytes(hidden * hidden * 2),
            ),
        ]
        for expert in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                rows, cols = (hidden, inter) if proj == "down_proj" else (inter, hidden)
                name = f"{prefix}.mlp.experts.{expert}.{proj}"
                tensors.append((f"{name}.weight", "U8", [rows, cols // 2], rng.randbytes(rows * cols // 2)))
                tensors.append(
                    (f"{name}.weight_scale", "F8_E4M3", [rows, cols // 16], rng.randbytes(rows * cols // 16))
                )
                tensors.append((f"{name}.weight_scale_2", "F32", [], rng.randbytes(4)))
        shards.append(tensors)
    total = len(shards)
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    for number, tensors in enumerate(shards, start=1):
        shard_name = f"model-{number:05d}-of-{total:05d}.safetensors"
        files[shard_name] = safetensors_bytes(tensors, {"format": "pt", "pd_rehearsal": "generated stand-in"})
        weight_map.update({name: shard_name for name, *_ in tensors})
    data_bytes = sum(len(data) for tensors in shards for *_, data in tensors)
    files["model.safetensors.index.json"] = _json_bytes(
        {"metadata": {"total_size": data_bytes}, "weight_map": weight_map}
    )
    files["config.json"] = _json_bytes(rehearsal_config(vocab_size))
    files["tokenizer.json"] = tokenizer_json
    files["tokenizer_config.json"] = _json_bytes(
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "add_bos_token": False,
            "model_max_length": 65536,
            "pd_appliance_rehearsal": "byte-level BPE built by pd_standins.hub, not DeepSeek's",
        }
    )
    files["README.md"] = (
        b"# Rehearsal checkpoint\n\nGenerated by pd_standins.hub: a stand-in for the"
        b" Hugging Face Hub repository, shaped like it, holding random bytes. It is not a model.\n"
    )
    if revision > 1:
        config = json.loads(files["config.json"])
        config["pd_rehearsal_revision"] = revision
        files["config.json"] = _json_bytes(config)
        files["README.md"] += f"\nRevision {revision}: the same shards, another config.json.\n".encode()
    return files


# The real checkpoint's config.json as far as SGLang decides on it (architecture, DeepSeek-V4 dims,
# the hybrid FP8 + NVFP4 quantization_config, the MTP layer), each field with its source and whether
# it is reconstructed: the Hub cannot be reached from here. tests/sglang/test_model_resolution.py
# runs SGLang 0.5.23's own model-config and quant-method resolution on it.
REAL_CONFIG_FILE = Path(__file__).with_name("data") / "deepseek_v4_flash_nvfp4.json"


def real_checkpoint_config() -> dict[str, object]:
    """nvidia/DeepSeek-V4-Flash-NVFP4's config.json (see REAL_CONFIG_FILE's provenance)."""
    return dict(json.loads(REAL_CONFIG_FILE.read_text())["config"])


def rehearsal_config(vocab_size: int) -> dict[str, object]:
    """The rehearsal checkpoint's config.json: the real one, but with the stand-in tokenizer's
    vocabulary (its embedding has one row per token) and its special tokens."""
    config = real_checkpoint_config()
    config.update(
        vocab_size=vocab_size,
        bos_token_id=vocab_size - 2,
        eos_token_id=vocab_size - 1,
        pd_appliance_rehearsal="tiny generated stand-in for nvidia/DeepSeek-V4-Flash-NVFP4, not a model:"
        " its config is the real one's shape, its tensors are small and random (names and dtypes as in"
        " the NVFP4 release: routed experts packed FP4 in U8)",
    )
    return config


def generate(out_dir: Path, revision: int = 1) -> bool:
    """Write the rehearsal checkpoint (its `revision`) into `out_dir`; True when anything was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    changed = False
    for name, data in rehearsal_checkpoint_files(revision=revision).items():
        target = out_dir / name
        if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
            continue
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        changed = True
    return changed


def _vocab_size(tokenizer_json: bytes) -> int:
    """Tokens of a tokenizer.json: its model's vocabulary plus the added (special) tokens."""
    data = json.loads(tokenizer_json)
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data["added_tokens"]]
    return max(ids) + 1


def _json_bytes(value: object) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


# --------------------------------------------------------------------------- the served repository


@dataclass(frozen=True)
class ServedFile:
    path: str
    local: Path
    size: int
    git_blob_id: str
    sha256: str | None  # LFS files only

    def tree_entry(self) -> dict[str, object]:
        entry: dict[str, object] = {
            "type": "file",
            "oid": self.git_blob_id,
            "size": self.size,
            "path": self.path,
        }
        if self.sha256 is not None:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return entry

    @property
    def etag(self) -> str:
        return self.sha256 or self.git_blob_id


class ServedRepo:
    """A folder as one commit of one repository: every file, its git blob id and (LFS) sha256."""

    def __init__(self, root: Path, repo_id: str, branch: str = "main") -> None:
        self.root, self.repo_id, self.branch = root, repo_id, branch
        self.files: dict[str, ServedFile] = {}
        for local in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = local.relative_to(root).as_posix()
            if any(part.startswith(".") for part in rel.split("/")):
                continue
            data = local.read_bytes()
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
            lfs = hashlib.sha256(data).hexdigest() if rel.endswith(LFS_SUFFIXES) else None
            self.files[rel] = ServedFile(rel, local, len(data), blob, lfs)
        listing = "".join(f"{f.git_blob_id} {f.path}\n" for f in self.files.values())
        self.commit = hashlib.sha1(
            f"pd-appliance rehearsal commit\n{repo_id}\n{listing}".encode()
        ).hexdigest()

    def resolves(self, revision: str) -> bool:
        return revision in (self.branch, self.commit)

    def folders(self) -> list[str]:
        names = {"/".join(f.split("/")[:i]) for f in self.files for i in range(1, f.count("/") + 1)}
        return sorted(names)


# --------------------------------------------------------------------------- the HTTP server


class RehearsalHub:
    """The server, in a thread. `faults` maps a repository path to "corrupt" (serve one flipped byte).

    `required_token`: when set, requests must carry it as a Bearer token (the Hub's private-repo
    behaviour); fault injection exists so tests can prove what the client does with a bad source.
    """

    def __init__(
        self,
        root: Path,
        repo_id: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        branch: str = "main",
        required_token: str | None = None,
        page_size: int = 1000,
        faults: dict[str, str] | None = None,
        extra_commits: Iterable[Path] = (),
    ) -> None:
        self.repo = ServedRepo(root, repo_id, branch)
        # Other commits of the repository, reachable by their commit id only (the branch is `root`'s).
        self.extra = [ServedRepo(Path(d), repo_id, branch) for d in extra_commits]
        self.required_token = required_token
        self.page_size = page_size
        self.faults: dict[str, str] = dict(faults or {})
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def reload(self) -> None:
        """Re-read the folder (a changed folder is a new commit)."""
        self.repo = ServedRepo(self.repo.root, self.repo.repo_id, self.repo.branch)

    def repo_for(self, revision: str) -> ServedRepo | None:
        """The commit `revision` names: the branch's, or one of the extra commits by id."""
        if self.repo.resolves(revision):
            return self.repo
        return next((r for r in self.extra if r.commit == revision), None)

    def record(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))

    def _announce(self) -> None:
        log.info(
            "%s: serving %s@%s from %s at %s",
            LABEL,
            self.repo.repo_id,
            self.repo.commit,
            self.repo.root,
            self.url,
        )

    def start(self) -> RehearsalHub:
        self._thread = threading.Thread(target=self._server.serve_forever, name="rehearsal-hub", daemon=True)
        self._thread.start()
        self._announce()
        return self

    def serve_forever(self) -> None:
        self._announce()
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> RehearsalHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler_for(hub: RehearsalHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    hub: RehearsalHub
    server_version = SERVER_HEADER
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log.info("%s: %s %s", LABEL, self.address_string(), format % args)

    # -- dispatch

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        self.hub.record(method, split.path)
        repo = self.hub.repo
        if not self._authorized():
            return
        api_prefix = f"/api/models/{repo.repo_id}"
        resolve_prefix = f"/{repo.repo_id}/resolve/"
        path = split.path
        if path == api_prefix and method == "GET":
            return self._model_info(repo.branch)
        if path.startswith(api_prefix + "/"):
            rest = path[len(api_prefix) + 1 :]
            kind, _, tail = rest.partition("/")
            revision, _, sub = tail.partition("/")
            revision = unquote(revision)
            if kind == "revision" and method == "GET":
                return self._model_info(revision)
            if kind == "tree" and method == "GET":
                return self._tree(revision, unquote(sub), parse_qs(split.query))
            if kind == "paths-info" and method == "POST":
                return self._paths_info(revision)
        elif path.startswith(resolve_prefix) and method in ("GET", "HEAD"):
            revision, _, filename = path[len(resolve_prefix) :].partition("/")
            return self._resolve(method, unquote(revision), unquote(filename))
        elif path.startswith("/api/models/") or "/resolve/" in path:
            return self._error(HTTPStatus.NOT_FOUND, "RepoNotFound", "Repository not found")
        return self._error(HTTPStatus.NOT_FOUND, None, f"{LABEL} does not implement {method} {path}")

    def _authorized(self) -> bool:
        required = self.hub.required_token
        if required is None:
            return True
        given = self.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            self._error(HTTPStatus.UNAUTHORIZED, "RepoNotFound", "Repository not found")
            return False
        if not hmac.compare_digest(given[len("Bearer ") :].encode(), required.encode()):
            self._error(HTTPStatus.UNAUTHORIZED, None, "Invalid credentials in Authorization header")
            return False
        return True

    # -- endpoints

    def _model_info(self, revision: str) -> None:
        repo = self.hub.repo_for(revision)
        if repo is None:
            return self._error(HTTPStatus.NOT_FOUND, "RevisionNotFound", f"Invalid rev id: {revision}")
        self._json(
            {
                "_id": repo.commit[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.commit,
                "private": self.hub.required_token is not None,
                "gated": False,
                "disabled": False,
                "tags": ["safetensors", "rehearsal"],
                "library_name": "transformers",
                "siblings": [{"rfilename": f} for f in repo.files],
                "pd_rehearsal_hub": f"{LABEL}: this is not huggingface.co",
            }
        )

    def _tree(self, revision: str, sub: str, query: dict[str, list[str]]) -> None:
        repo = self.hub.repo_for(revision)
        if repo is None:
            return self._error(HTTPStatus.NOT_FOUND, "RevisionNotFound", f"Invalid rev id: {revision}")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{sub.rstrip('/')}/" if sub else ""
        if sub and sub not in repo.folders():
            return self._error(HTTPStatus.NOT_FOUND, "EntryNotFound", f"{sub} does not exist on {revision}")
        entries: list[dict[str, object]] = []
        for folder in repo.folders():
            if folder.startswith(prefix) and (recursive or "/" not in folder[len(prefix) :]):
                entries.append(
                    {
                        "type": "directory",
                        "oid": hashlib.sha1(folder.encode()).hexdigest(),
                        "size": 0,
                        "path": folder,
                    }
                )
        for f in repo.files.values():
            if f.path.startswith(prefix) and (recursive or "/" not in f.path[len(prefix) :]):
                entries.append(f.tree_entry())
        entries.sort(key=lambda e: str(e["path"]))
        cursor = int(query.get("cursor", ["0"])[0])
        page = entries[cursor : cursor + self.hub.page_size]
        headers = {}
        if cursor + self.hub.page_size < len(entries):
            base = self.path.split("?", 1)[0]
            nxt = (
                f"{base}?recursive={str(recursive).lower()}&expand=false&cursor={cursor + self.hub.page_size}"
            )
            headers["Link"] = f'<http://{self.headers.get("Host")}{nxt}>; rel="next"'
        self._json(page, headers)

    def _paths_info(self, revision: str) -> None:
        repo = self.hub.repo_for(revision)
        if repo is None:
            return self._error(HTTPStatus.NOT_FOUND, "RevisionNotFound", f"Invalid rev id: {revision}")
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length).decode()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = list(json.loads(body or "{}").get("paths", []))
        else:
            paths = parse_qs(body).get("paths", [])
        out: list[dict[str, object]] = []
        for name in paths:
            if name in repo.files:
                out.append(repo.files[name].tree_entry())
            elif name in repo.folders():
                out.append(
                    {
                        "type": "directory",
                        "oid": hashlib.sha1(name.encode()).hexdigest(),
                        "size": 0,
                        "path": name,
                    }
                )
        self._json(out)

    def _resolve(self, method: str, revision: str, filename: str) -> None:
        repo = self.hub.repo_for(revision)
        if repo is None:
            return self._error(HTTPStatus.NOT_FOUND, "RevisionNotFound", f"Invalid rev id: {revision}")
        served = repo.files.get(filename)
        if served is None:
            return self._error(
                HTTPStatus.NOT_FOUND, "EntryNotFound", f"{filename} does not exist on {revision}"
            )
        start, end = 0, served.size - 1
        status = HTTPStatus.OK
        range_header = self.headers.get("Range")
        if range_header and method == "GET":
            parsed = _parse_range(range_header, served.size)
            if parsed is None:
                return self._error(
                    HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, None, f"bad range {range_header}"
                )
            start, end = parsed
            status = HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        self._common_headers()
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{served.git_blob_id}"')
        if served.sha256 is not None:
            self.send_header("X-Linked-Etag", f'"{served.sha256}"')
            self.send_header("X-Linked-Size", str(served.size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Disposition", f"inline; filename*=UTF-8''{quote(filename.split('/')[-1])}")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1 if served.size else 0))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{served.size}")
        self.end_headers()
        if method == "HEAD" or served.size == 0:
            return
        corrupt_at = served.size // 2 if self.hub.faults.get(filename) == "corrupt" else -1
        with served.local.open("rb") as handle:
            handle.seek(start)
            position, remaining = start, end - start + 1
            while remaining > 0:
                chunk = bytearray(handle.read(min(1 << 20, remaining)))
                if not chunk:
                    break
                if position <= corrupt_at < position + len(chunk):
                    chunk[corrupt_at - position] ^= 0xFF
                self.wfile.write(chunk)
                position += len(chunk)
                remaining -= len(chunk)

    # -- helpers

    def _common_headers(self) -> None:
        self.send_header("X-PD-Rehearsal-Hub", "stand-in for the Hugging Face Hub; not huggingface.co")

    def _json(self, value: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(value).encode()
        self.send_response(HTTPStatus.OK)
        self._common_headers()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, val in (headers or {}).items():
            self.send_header(key, val)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: HTTPStatus, code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self._common_headers()
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    if not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[len("bytes=") :].partition("-")
    try:
        if first == "":
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), (int(last) if last else size - 1)
    except ValueError:
        return None
    end = min(end, size - 1)
    return (start, end) if 0 <= start <= end else None


# --------------------------------------------------------------------------- running it from the role


def _start_detached(args: argparse.Namespace, *, started_key: bool = False) -> int:
    """Start `serve` in its own session, wait until it listens, print {"endpoint", "pid"} as JSON."""
    state_file = Path(args.state_file)
    _stop(state_file, quiet=True)
    state_file.parent.mkdir(parents=True, exist_ok=True)
    ready = state_file.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    log_path = Path(args.log_file) if args.log_file else state_file.with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pd_standins.hub", "serve",
        "--repo-dir", args.repo_dir, "--repo-id", args.repo_id, "--host", args.host,
        "--port", str(args.port), "--ready-file", str(ready),
        *[f"--extra-commit-dir={d}" for d in args.extra_commit_dir],
    ]  # fmt: skip
    with log_path.open("ab") as log_handle:
        proc = subprocess.Popen(
            command,
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            print(f"{LABEL} did not start; see {log_path}", file=sys.stderr)
            return 1
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    info["pid"] = proc.pid
    state_file.write_text(json.dumps(info) + "\n")
    ready.unlink(missing_ok=True)
    print(json.dumps({**info, "started": True} if started_key else info))
    return 0


def _running(state_file: Path, args: argparse.Namespace) -> dict | None:
    """The recorded hub when it is alive and serves what `args` asks for, else None."""
    try:
        info = json.loads(state_file.read_text())
        cmdline = Path(f"/proc/{int(info['pid'])}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError):
        return None
    wanted = [b"--repo-dir", args.repo_dir.encode(), b"--repo-id", args.repo_id.encode(),
              b"--host", args.host.encode(), b"--port", str(args.port).encode()]  # fmt: skip
    joined = b"\0".join(cmdline)
    return info if b"pd_standins.hub" in cmdline and b"\0".join(wanted) in joined else None


def _ensure(args: argparse.Namespace) -> int:
    """Keep a hub that already serves this repository at this address; start one otherwise."""
    info = _running(Path(args.state_file), args)
    if info is not None:
        print(json.dumps({**info, "started": False}))
        return 0
    return _start_detached(args, started_key=True)


def _stop(state_file: Path, *, quiet: bool = False) -> bool:
    """Stop the hub recorded in `state_file`, only if that pid still is a rehearsal hub."""
    try:
        pid = int(json.loads(state_file.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        if not quiet:
            print("not running")
        return False
    stopped = False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"pd_standins.hub" in cmdline and b"serve" in cmdline:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
                    break
                time.sleep(0.05)
            stopped = True
    except (OSError, ProcessLookupError):
        pass
    state_file.unlink(missing_ok=True)
    if not quiet:
        print("stopped" if stopped else "not running")
    return stopped


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pd_standins.hub", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate", help="write the tiny rehearsal checkpoint; prints 'generated' or 'unchanged'"
    )
    gen.add_argument("--out", required=True)
    gen.add_argument(
        "--revision", type=int, default=1, help="a later commit (same shards, another config.json)"
    )
    for name in ("serve", "start", "ensure"):
        cmd = sub.add_parser(
            name, help=f"{name} the hub ({'foreground' if name == 'serve' else 'detached, prints JSON'})"
        )
        cmd.add_argument("--repo-dir", required=True)
        cmd.add_argument("--repo-id", required=True)
        cmd.add_argument("--host", default="127.0.0.1")
        cmd.add_argument("--port", type=int, default=0)
        cmd.add_argument("--extra-commit-dir", action="append", default=[],
                         help="another commit of the repository, served by its id (repeatable)")  # fmt: skip
        if name == "serve":
            cmd.add_argument("--ready-file")
        elif name == "ensure":
            cmd.add_argument("--state-file", required=True)
            cmd.add_argument("--log-file")
        else:
            cmd.add_argument("--state-file", required=True)
            cmd.add_argument("--log-file")
    stop = sub.add_parser("stop", help="stop the hub a `start` recorded")
    stop.add_argument("--state-file", required=True)
    args = parser.parse_args(list(argv) if argv is not None else None)

    if args.command == "generate":
        print("generated" if generate(Path(args.out), args.revision) else "unchanged")
        return 0
    if args.command == "stop":
        _stop(Path(args.state_file))
        return 0
    if args.command == "start":
        return _start_detached(args)
    if args.command == "ensure":
        return _ensure(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    hub = RehearsalHub(
        Path(args.repo_dir), args.repo_id, host=args.host, port=args.port,
        extra_commits=[Path(d) for d in args.extra_commit_dir],
    )  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=hub._server.shutdown).start())
    if args.ready_file:
        tmp = Path(args.ready_file).with_suffix(".tmp")
        tmp.write_text(json.dumps({"endpoint": hub.url, "commit": hub.repo.commit, "label": LABEL}))
        os.replace(tmp, args.ready_file)
    hub.serve_forever()
    hub._server.server_close()
    log.info("%s: stopped", LABEL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
