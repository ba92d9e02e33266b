"""Download and verification through the real huggingface_hub client against the rehearsal hub."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from checkpoint_testlib import overwrite_in_place

from pd_appliance.checkpoint import (
    MANIFEST_NAME,
    CheckpointError,
    CheckpointIntegrityError,
    ensure_checkpoint,
    verify_directory,
)
from pd_appliance.checkpoint.ensure import PARTIAL_DIR
from pd_standins.hub import RehearsalHub

REPO_ID = "nvidia/DeepSeek-V4-Flash-NVFP4"
SHARD = "model-00002-of-00003.safetensors"
pytestmark = pytest.mark.slow  # every test here starts the rehearsal hub (an HTTP server)


def downloads(hub: RehearsalHub) -> list[str]:
    return [path for method, path in hub.requests if method == "GET" and "/resolve/" in path]


def test_fresh_download_matches_source_and_records_manifest(hub, repo_dir, make_request):
    report = ensure_checkpoint(make_request(hub.url))
    target = Path(report.directory)
    assert report.changed and report.revision == hub.repo.commit
    assert sorted(report.fetched) == sorted(hub.repo.files)
    for name in hub.repo.files:
        assert (target / name).read_bytes() == (repo_dir / name).read_bytes()
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    assert manifest["revision"] == hub.repo.commit and manifest["revision_requested"] == "main"
    shard = manifest["files"][SHARD]
    assert shard["sha256"] == hashlib.sha256((repo_dir / SHARD).read_bytes()).hexdigest() and shard["lfs"]
    assert shard["mtime_ns"] == (target / SHARD).stat().st_mtime_ns
    assert not manifest["files"]["config.json"]["lfs"]
    assert ("GET", f"/api/models/{REPO_ID}/revision/main") in hub.requests
    assert any(path.startswith(f"/api/models/{REPO_ID}/tree/{hub.repo.commit}") for _, path in hub.requests)
    # Nothing half-written is left: no partial files remain, nothing but checkpoint files + bookkeeping.
    assert not list((target / PARTIAL_DIR).glob("*.part"))
    assert report.extra_files == []
    assert any("not a commit" in w for w in report.warnings)  # "main" is a branch: told to pin it


def test_rerun_verifies_by_stat_and_changes_nothing(hub, make_request):
    ensure_checkpoint(make_request(hub.url))
    manifest_path = Path(make_request(hub.url).directory) / MANIFEST_NAME
    before = manifest_path.stat().st_mtime_ns
    hub.requests.clear()
    report = ensure_checkpoint(make_request(hub.url))
    assert not report.changed and report.fetched == [] and report.hashed_files == 0
    assert report.verified_by_stat == len(hub.repo.files)
    assert downloads(hub) == [] and manifest_path.stat().st_mtime_ns == before
    pinned = ensure_checkpoint(make_request(hub.url, revision=hub.repo.commit))
    assert pinned.fetched == [] and pinned.hashed_files == 0  # the pin is recorded, no byte re-read
    assert not any("not a commit" in w for w in pinned.warnings)


def test_flipped_byte_is_refetched_then_ok(hub, make_request):
    request = make_request(hub.url)
    ensure_checkpoint(request)
    shard = request.directory / SHARD
    overwrite_in_place(shard, shard.stat().st_size // 2, later_ns=1_000_000_000)  # modified a second later
    hub.requests.clear()
    report = ensure_checkpoint(request)
    assert report.changed and report.fetched == [SHARD] and report.hashed_files == 1
    assert downloads(hub) == [f"/{REPO_ID}/resolve/{hub.repo.commit}/{SHARD}"]
    assert verify_directory(request.directory).hashed_files == len(hub.repo.files)


def test_flip_with_preserved_mtime_needs_full_verify(hub, make_request):
    request = make_request(hub.url)
    ensure_checkpoint(request)
    shard = request.directory / SHARD
    # Inside tensor data, the mtime kept: only a hash can see it.
    overwrite_in_place(shard, shard.stat().st_size - 1000, b"\x00\x01\x02")
    assert not ensure_checkpoint(request).changed  # by design: stat says unchanged
    with pytest.raises(CheckpointIntegrityError, match=SHARD):
        verify_directory(request.directory)
    report = ensure_checkpoint(make_request(hub.url, verify="full"))
    assert report.fetched == [SHARD]


def test_broken_header_with_preserved_mtime_is_caught_without_full_verify(hub, make_request):
    request = make_request(hub.url)
    ensure_checkpoint(request)
    shard = request.directory / SHARD
    overwrite_in_place(shard, 100, b"\x00\x01\x02")  # inside the JSON header
    report = ensure_checkpoint(request)
    assert report.fetched == [SHARD] and report.hashed_files == 1


def test_truncated_shard_is_refetched(hub, make_request):
    request = make_request(hub.url)
    ensure_checkpoint(request)
    shard = request.directory / SHARD
    os.truncate(shard, shard.stat().st_size - 4096)
    with pytest.raises(CheckpointIntegrityError, match=r"truncated"):
        verify_directory(request.directory)
    report = ensure_checkpoint(request)
    assert report.fetched == [SHARD] and report.hashed_files == 0  # size alone condemned it, no hash needed
    assert verify_directory(request.directory).files == len(hub.repo.files)


def test_interrupted_download_resumes_from_partial(hub, repo_dir, make_request):
    request = make_request(hub.url)
    ensure_checkpoint(request)
    shard = request.directory / SHARD
    expected = hashlib.sha256(shard.read_bytes()).hexdigest()
    partial = request.directory / PARTIAL_DIR / f"{expected}.part"
    partial.write_bytes((repo_dir / SHARD).read_bytes()[:300_000])  # what a killed transfer leaves
    shard.unlink()
    hub.requests.clear()
    report = ensure_checkpoint(request)
    assert report.fetched == [SHARD] and shard.read_bytes() == (repo_dir / SHARD).read_bytes()
    assert not partial.exists()


def test_source_serving_wrong_bytes_fails_naming_file_and_hashes(hub, repo_dir, make_request):
    request = make_request(hub.url)
    ensure_checkpoint(request)
    shard = request.directory / SHARD
    os.truncate(shard, 10)
    hub.faults[SHARD] = "corrupt"
    with pytest.raises(CheckpointIntegrityError) as caught:
        ensure_checkpoint(request)
    expected = hashlib.sha256((repo_dir / SHARD).read_bytes()).hexdigest()
    message = str(caught.value)
    assert SHARD in message and f"expected sha256 {expected}" in message
    actual = caught.value.problems[0].actual_sha256
    assert actual and actual != expected and f"actual sha256 {actual}" in message
    assert shard.stat().st_size == 10  # the bad download never replaced anything
    assert not list((request.directory / PARTIAL_DIR).glob("*.part"))


def test_index_naming_a_missing_shard_is_a_clear_error(tmp_path, make_request, checkpoint_writer):
    root = tmp_path / "broken-repo"
    checkpoint_writer(root, extra_index_shard="model-00009-of-00003.safetensors")
    with RehearsalHub(root, REPO_ID) as hub, pytest.raises(CheckpointIntegrityError) as caught:
        ensure_checkpoint(make_request(hub.url))
    message = str(caught.value)
    assert "model.safetensors.index.json maps 1 tensor(s) to model-00009-of-00003.safetensors" in message
    assert "checkpoint_revision" in message


def test_offline_verifies_and_never_fetches(hub, make_request):
    ensure_checkpoint(make_request(hub.url))
    hub.requests.clear()
    dead = "http://127.0.0.1:9"  # nothing listens; offline must not even try
    report = ensure_checkpoint(make_request(dead, offline=True))
    assert not report.changed and report.verified_by_stat == len(hub.repo.files)
    shard = make_request(dead).directory / SHARD
    os.truncate(shard, 100)
    with pytest.raises(CheckpointIntegrityError, match="checkpoint_offline is true, so nothing is fetched"):
        ensure_checkpoint(make_request(hub.url, offline=True))
    assert hub.requests == []


def test_offline_without_manifest_says_how_to_seed(tmp_path, make_request):
    (tmp_path / "model").mkdir()
    with pytest.raises(CheckpointError, match="rsync -a"):
        ensure_checkpoint(make_request("http://127.0.0.1:9", offline=True))


def test_offline_seeded_copy_is_hashed_once_then_by_stat(hub, tmp_path, make_request):
    ensure_checkpoint(make_request(hub.url))
    seeded = tmp_path / "seeded"
    os.system(f"cp -r {make_request(hub.url).directory} {seeded}")  # new inodes and mtimes, as a copy has
    first = ensure_checkpoint(make_request(hub.url, directory=seeded, offline=True))
    assert first.hashed_files == len(hub.repo.files) and first.manifest_written and first.changed
    second = ensure_checkpoint(make_request(hub.url, directory=seeded, offline=True))
    assert not second.changed and second.verified_by_stat == len(hub.repo.files)


def test_wrong_token_names_the_variable_and_hides_the_token(repo_dir, make_request):
    secret = "hf_rightTokenValue123"
    wrong = "hf_wrongTokenValue456"
    with RehearsalHub(repo_dir, REPO_ID, required_token=secret) as hub:
        with pytest.raises(CheckpointError) as caught:
            ensure_checkpoint(make_request(hub.url, token=wrong))
        assert "checkpoint_hf_token" in str(caught.value) and "401" in str(caught.value)
        assert wrong not in str(caught.value)
        with pytest.raises(CheckpointError, match="set checkpoint_hf_token if it is private"):
            ensure_checkpoint(make_request(hub.url))
        report = ensure_checkpoint(make_request(hub.url, token=secret))
        assert report.fetched
    for path in report_files(make_request(hub.url).directory):
        assert secret.encode() not in path.read_bytes(), path


def report_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


def test_unknown_revision_and_unreachable_endpoint(hub, make_request):
    with pytest.raises(CheckpointError, match="Fix: checkpoint_revision"):
        ensure_checkpoint(make_request(hub.url, revision="no-such-branch"))
    with pytest.raises(CheckpointError, match="checkpoint_hf_endpoint"):
        ensure_checkpoint(make_request("http://127.0.0.1:9"))


def test_patterns_select_files_and_warn_about_left_out_shards(hub, make_request):
    report = ensure_checkpoint(make_request(hub.url, allow_patterns=["*.json"]))
    assert report.fetched == ["config.json", "model.safetensors.index.json"]
    assert any("download patterns left out" in w for w in report.warnings)
    again = ensure_checkpoint(make_request(hub.url, allow_patterns=["*.json"]))
    assert not again.changed
    offline = ensure_checkpoint(make_request(hub.url, offline=True))
    assert not offline.changed and any("left out" in w for w in offline.warnings)


def test_new_commit_refetches_only_changed_files(hub, repo_dir, make_request):
    ensure_checkpoint(make_request(hub.url))
    (repo_dir / "config.json").write_text('{"architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 512}')
    old = hub.repo.commit
    hub.reload()
    assert hub.repo.commit != old
    report = ensure_checkpoint(make_request(hub.url))
    assert report.revision == hub.repo.commit and report.fetched == ["config.json"]
    assert report.hashed_files == len(hub.repo.files)  # a new commit: every file re-proven, only one fetched


def test_check_mode_reports_without_touching(hub, make_request):
    request = make_request(hub.url, check_mode=True)
    request.directory.mkdir()
    report = ensure_checkpoint(request)
    assert report.changed and sorted(report.would_fetch) == sorted(hub.repo.files)
    assert list(request.directory.iterdir()) == []


def test_not_enough_disk_is_refused_before_fetching(hub, make_request):
    request = make_request(hub.url, disk_reserve_bytes=1 << 60)
    with pytest.raises(CheckpointError, match=r" has \d+ bytes free; fetching 5 file\(s\)"):
        ensure_checkpoint(request)
    assert downloads(hub) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="changing ownership needs root")
def test_ownership_goes_to_the_service_user(hub, make_request):
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' account")
    import grp

    group = grp.getgrgid(nobody.pw_gid).gr_name
    first = ensure_checkpoint(make_request(hub.url, owner="nobody", group=group))
    target = Path(first.directory)
    assert first.ownership_changed
    for path in [target, target / MANIFEST_NAME, *(target / name for name in hub.repo.files)]:
        assert (path.stat().st_uid, path.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid), path
    again = ensure_checkpoint(make_request(hub.url, owner="nobody", group=group))
    assert not again.changed and not again.ownership_changed
    with pytest.raises(CheckpointError, match="appliance_user 'no-such-user-x' does not exist"):
        ensure_checkpoint(make_request(hub.url, owner="no-such-user-x"))
