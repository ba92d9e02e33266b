"""Unit tests: safetensors structure checks, index checks, hashing, manifest round trip, hub fidelity."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from pd_appliance.checkpoint.hashing import HashJob, hash_file, hash_files
from pd_appliance.checkpoint.manifest import (
    Manifest,
    ManifestEntry,
    ManifestError,
    load_manifest,
    write_manifest,
)
from pd_appliance.checkpoint.safetensors_format import (
    SafetensorsFormatError,
    check_index,
    read_safetensors_summary,
)
from pd_standins.hub import RehearsalHub, generate, rehearsal_checkpoint_files


def real_shard(path: Path) -> Path:
    save_file(
        {"a": np.arange(1000, dtype=np.float32), "b": np.ones((16, 16), dtype=np.uint8)},
        str(path),
        metadata={},
    )
    return path


def rewrite_header(path: Path, mutate) -> None:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    mutate(header)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])


def test_real_shard_passes(tmp_path):
    summary = read_safetensors_summary(real_shard(tmp_path / "s.safetensors"))
    assert summary.tensors == {"a", "b"} and summary.data_bytes == 4000 + 256


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-100]), "truncated"),
        (lambda p: p.write_bytes(p.read_bytes()[:5]), "too short"),
        (lambda p: p.write_bytes(b"\xff" * 8 + b"x" * 100), "does not fit"),
        (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 8), "cover"),
        (lambda p: rewrite_header(p, lambda h: h["a"].update(shape=[999])), "needs 3996 bytes"),
        (lambda p: rewrite_header(p, lambda h: h["a"].update(dtype="Q7")), "unknown dtype"),
        (lambda p: rewrite_header(p, lambda h: h["b"].update(data_offsets=[3992, 4248])), "gap or overlap"),
    ],
)
def test_damaged_shard_is_named_precisely(tmp_path, damage, message):
    shard = real_shard(tmp_path / "s.safetensors")
    damage(shard)
    with pytest.raises(SafetensorsFormatError, match=message):
        read_safetensors_summary(shard)


def test_index_checks():
    index = json.dumps({"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors", "z": "s1.safetensors"}})
    tensors = {"sub/s1.safetensors": frozenset({"x"})}
    problems, warnings = check_index(
        "sub/model.safetensors.index.json", index.encode(), {"sub/s1.safetensors"}, tensors
    )
    assert "maps 1 tensor(s) to sub/s2.safetensors, which is not a file of the checkpoint" in problems[0]
    assert "that its header does not hold (first: 'z')" in problems[1] and warnings == []
    problems, warnings = check_index(
        "sub/model.safetensors.index.json",
        index.encode(),
        {"sub/s1.safetensors"},
        tensors,
        {"sub/s2.safetensors"},
    )
    assert len(problems) == 1 and "left out" in warnings[0]
    assert "not a safetensors index" in check_index("i.json", b"[]", set(), {})[0][0]


def test_hashes_match_hashlib_and_git(tmp_path):
    files = []
    for number, size in enumerate([0, 1, 5_000_001, 17 << 20]):
        path = tmp_path / f"f{number}"
        path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        files.append(path)
    digests = hash_files([HashJob(p.name, p, git_sha1=True) for p in files], workers=3, chunk_bytes=1 << 20)
    for path in files:
        digest = digests[path.name]
        assert digest.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
        assert digest.git_sha1 == git.stdout.strip()
    seen = []
    hash_file(files[2], progress=seen.append, chunk_bytes=1 << 20)
    assert sum(seen) == files[2].stat().st_size and len(seen) == 5
    missing = hash_files([HashJob("gone", tmp_path / "nope")])
    assert isinstance(missing["gone"], OSError)


def test_manifest_round_trip_and_refusals(tmp_path):
    entry = ManifestEntry(size=3, sha256="ab" * 32, git_blob_id=None, lfs=True, mtime_ns=1, inode=2)
    manifest = Manifest("o/r", "c" * 40, "main", "http://x", {"a": entry}, ["b"])
    write_manifest(tmp_path, manifest)
    assert load_manifest(tmp_path) == manifest and [p.name for p in tmp_path.iterdir()] == [
        ".pd-appliance-manifest.json"
    ]
    (tmp_path / ".pd-appliance-manifest.json").write_text('{"format": "other"}')
    with pytest.raises(ManifestError, match="not a pd-appliance checkpoint manifest"):
        load_manifest(tmp_path)
    assert load_manifest(tmp_path / "nowhere") is None


def test_rehearsal_checkpoint_is_real_safetensors_and_deterministic(tmp_path):
    assert generate(tmp_path) is True and generate(tmp_path) is False
    files = rehearsal_checkpoint_files()
    index = json.loads(files["model.safetensors.index.json"])
    for shard in {*index["weight_map"].values()}:
        with safe_open(str(tmp_path / shard), framework="numpy") as handle:
            names = set(handle.keys())
            assert names == read_safetensors_summary(tmp_path / shard).tensors
            for name in names:
                tensor_slice = handle.get_slice(name)  # the loader's own offset checks pass
                if tensor_slice.get_dtype() in ("U8", "F32"):  # numpy has no bfloat16 / float8
                    assert list(handle.get_tensor(name).shape) == tensor_slice.get_shape()
    problems, _ = check_index(
        "model.safetensors.index.json",
        files["model.safetensors.index.json"],
        set(files),
        {s: read_safetensors_summary(tmp_path / s).tensors for s in index["weight_map"].values()},
    )
    assert problems == []


@pytest.mark.slow
def test_hub_fidelity_for_the_client_calls(repo_dir, repo_id):
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url

    with RehearsalHub(repo_dir, repo_id, page_size=2) as hub:
        api = HfApi(endpoint=hub.url, token=False)
        info = api.model_info(repo_id, revision="main")
        assert info.sha == hub.repo.commit and "stand-in" in info.pd_rehearsal_hub
        tree = list(api.list_repo_tree(repo_id, revision=info.sha, recursive=True))  # paginated: 2 per page
        assert sorted(f.path for f in tree) == sorted(hub.repo.files)
        paths = api.get_paths_info(
            repo_id, ["config.json", "model-00001-of-00003.safetensors"], revision=info.sha
        )
        by_path = {p.path: p for p in paths}
        shard = repo_dir / "model-00001-of-00003.safetensors"
        assert (
            by_path["model-00001-of-00003.safetensors"].lfs.sha256
            == hashlib.sha256(shard.read_bytes()).hexdigest()
        )
        assert by_path["config.json"].lfs is None
        meta = get_hf_file_metadata(
            hf_hub_url(repo_id, shard.name, revision=info.sha, endpoint=hub.url), token=False
        )
        assert meta.commit_hash == info.sha and meta.size == shard.stat().st_size
        assert meta.etag == hashlib.sha256(shard.read_bytes()).hexdigest()
        assert sum(1 for m, p in hub.requests if "/tree/" in p) >= 3
