"""pd_appliance.release without processes: ids, changes, the restart plan, the store, refusals, pruning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pd_appliance.release import ReleaseError, build
from pd_appliance.release import host as release_host
from pd_appliance.release.record import Release, caches_part, compare
from pd_appliance.release.rollout import plan
from pd_appliance.release.store import ACCEPTED, FAILED, PRUNED, ReleaseStore

SECTION = (
    "[program:{name}]\n; rendered by the serving role\ncommand=/venv/{venv}/bin/python -m sglang {flags}\n"
)


def parts(venv: str, revision: str, flags: str = "", root: Path = Path("/x")) -> dict:
    return {
        "sglang": {"version": "0.5.23", "build": venv, "venv": str(root / "sglang" / venv), "series": []},
        "checkpoint": {"repo_id": "o/m", "revision": revision, "dir": str(root / "models" / revision)},
        "variant": {},
        "programs": {
            name: {"role": name, "section": SECTION.format(name=name, venv=venv, flags=flags)}
            for name in ("prefill", "decode")
        },
        "group": "[group:pd]\nprograms=prefill,decode\n",
    }


def test_id_ignores_section_comments_and_changes_with_a_flag() -> None:
    a = Release(parts=parts("v1", "a" * 40))
    commented = parts("v1", "a" * 40)
    commented["programs"]["decode"]["section"] += "; a note\n"
    assert Release(parts=commented).id == a.id
    assert Release(parts=parts("v1", "a" * 40, flags="--x")).id != a.id


def test_compare_switches_workers_on_new_code_or_weights_only() -> None:
    old = Release(parts=parts("v1", "a" * 40))
    flags = compare(old, Release(parts=parts("v1", "a" * 40, flags="--x")))
    assert flags.parts == ["programs"] and flags.programs == ["decode", "prefill"] and not flags.switch
    venv = compare(old, Release(parts=parts("v2", "a" * 40)))
    assert "sglang" in venv.parts and venv.switch
    weights = compare(old, Release(parts=parts("v1", "b" * 40)))
    assert weights.parts == ["checkpoint"] and weights.switch


def test_plan_restarts_switching_workers_together_and_the_router_last() -> None:
    roles = {"prefill": "prefill", "decode": "decode", "decode-1": "decode", "router": "router"}
    todo = ["router", "decode", "decode-1", "prefill"]
    together = plan(todo, roles, switch=True, order=["prefill", "decode", "decode-1", "router"])
    assert together.waves() == [["prefill", "decode", "decode-1"], ["router"]]
    rolling = plan(todo, roles, switch=False, order=["prefill", "decode", "decode-1", "router"])
    assert rolling.waves() == [["prefill"], ["decode"], ["decode-1"], ["router"]]
    # the first decode answers before the second one goes down: the role keeps serving
    assert [s.wait for s in rolling.steps] == [False, True, False, False]


def test_store_stage_accept_fail_and_rollback_target(tmp_path: Path) -> None:
    store = ReleaseStore(tmp_path)
    one, two = Release(parts=parts("v1", "a" * 40)), Release(parts=parts("v2", "a" * 40))
    store.stage(one)
    store.accept(one.id)
    previous, change = store.stage(two)
    assert previous is not None and previous.id == one.id and change.switch
    assert store.rollback_target() == (store.record(one.id), [])
    store.fail(two.id, "bs=1 output throughput 16 < 60")
    reread = ReleaseStore(tmp_path)  # the state survives on disk
    assert reread.status_of(two.id) == FAILED and reread.accepted() == [one.id]
    reread.activate(one.id, "validation failed")
    assert reread.current_id == one.id
    events = [json.loads(line)["event"] for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert events == ["staged", "accepted", "staged", "failed", "rolled back"]


def _conf(tmp_path: Path, release: Release) -> release_host.HostPaths:
    conf = tmp_path / "conf.d"
    conf.mkdir(exist_ok=True)
    for name, program in release.programs.items():
        (conf / f"{name}.conf").write_text(program["section"])
    return release_host.HostPaths(tmp_path / "state", conf)


def test_stage_refuses_a_failed_release_and_puts_the_running_sections_back(tmp_path: Path) -> None:
    good, bad = Release(parts=parts("v1", "a" * 40)), Release(parts=parts("v1", "a" * 40, flags="--bad"))
    paths = _conf(tmp_path, good)
    programs = {"prefill": {"role": "prefill"}, "decode": {"role": "decode"}}
    sglang_ck = {k: good.parts[k] for k in ("sglang", "checkpoint")}
    first = release_host.stage(paths, sglang_ck, programs, None)
    ReleaseStore(paths.state_dir).accept(first["release"]["id"])
    _conf(tmp_path, bad)
    second = release_host.stage(paths, sglang_ck, programs, None)
    ReleaseStore(paths.state_dir).fail(second["release"]["id"], "gate failed")
    ReleaseStore(paths.state_dir).activate(first["release"]["id"], "rolled back")
    _conf(tmp_path, bad)  # the inventory still asks for the failed one
    with pytest.raises(
        ReleaseError, match=r"Refused: release r-[0-9a-f]{12} .* failed validation .*gate failed"
    ):
        release_host.stage(paths, sglang_ck, programs, None)
    assert (paths.conf_dir / "decode.conf").read_text() == good.programs["decode"]["section"]
    _conf(tmp_path, bad)  # rendered again, now with release_retry_failed
    retried = release_host.stage(paths, sglang_ck, programs, None, retry_failed=True)
    assert retried["release"]["id"] == second["release"]["id"]


def test_stage_refuses_to_switch_to_a_venv_that_is_not_installed(tmp_path: Path) -> None:
    good = Release(parts=parts("v1", "a" * 40))
    paths = _conf(tmp_path, good)
    programs = {"prefill": {"role": "prefill"}, "decode": {"role": "decode"}}
    release_host.stage(paths, {k: good.parts[k] for k in ("sglang", "checkpoint")}, programs, None)
    missing = dict(parts("v2", "a" * 40)["sglang"], installed=False, problem="venv v2 is not installed")
    _conf(tmp_path, Release(parts=parts("v2", "a" * 40)))
    with pytest.raises(ReleaseError, match="SGLang venv that is not ready: venv v2 is not installed"):
        release_host.stage(paths, {"sglang": missing, "checkpoint": good.parts["checkpoint"]}, programs, None)
    assert "/v1/" in (paths.conf_dir / "prefill.conf").read_text()


def _installed(root: Path, release: Release) -> None:
    for key in ("sglang", "checkpoint"):
        directory = Path(release.parts[key]["venv" if key == "sglang" else "dir"])
        (directory / "bin").mkdir(parents=True, exist_ok=True)
        (directory / "payload").write_bytes(b"x" * 1000)


def test_prune_keeps_a_count_removes_unused_installs_and_frees_disk_early(tmp_path: Path) -> None:
    store = ReleaseStore(tmp_path / "state")
    releases = [
        Release(parts=parts("v1", "a" * 40, root=tmp_path)),
        Release(parts=parts("v2", "a" * 40, root=tmp_path)),
        Release(parts=parts("v3", "b" * 40, root=tmp_path)),
    ]
    for release in releases:
        _installed(tmp_path, release)
        store.stage(release)
        store.accept(release.id)
    venvs, models = tmp_path / "sglang", tmp_path / "models"
    result = store.prune(2, 2, venvs, models, free_bytes=lambda _p: 10**12)
    assert result.pruned == [releases[0].id] and store.status_of(releases[0].id) == PRUNED
    assert result.removed_paths == [str(venvs / "v1")], "revision a is still used by v2"
    assert sorted(p.name for p in venvs.iterdir()) == ["v2", "v3"]
    # one checkpoint revision only: the release on revision a goes with it, once b is accepted
    result = store.prune(2, 1, venvs, models, free_bytes=lambda _p: 10**12)
    assert result.pruned == [releases[1].id] and not (models / ("a" * 40)).exists()
    assert store.accepted() == [releases[2].id] and store.status_of(releases[2].id) == ACCEPTED
    with pytest.raises(ReleaseError, match="must be >= 1"):
        store.prune(0, 1, venvs, models)


def test_prune_drops_older_releases_early_when_the_disk_is_short(tmp_path: Path) -> None:
    store = ReleaseStore(tmp_path / "state")
    one, two = (
        Release(parts=parts("v1", "a" * 40, root=tmp_path)),
        Release(parts=parts("v2", "b" * 40, root=tmp_path)),
    )
    for release in (one, two):
        _installed(tmp_path, release)
        store.stage(release)
        store.accept(release.id)
    result = store.prune(
        3, 3, tmp_path / "sglang", tmp_path / "models", min_free_bytes=5000, free_bytes=lambda _p: 100
    )
    assert result.pruned == [one.id] and "pruned before its turn" in result.notes[0]
    assert "only the current release is kept" in result.notes[-1]
    assert store.current_id == two.id and (tmp_path / "sglang" / "v2").is_dir()


def _caches(root: Path, build: str) -> dict:
    cache = root / "state/home/cache"
    build_dir = str(cache / "sglang" / build)
    env = {"TRITON_CACHE_DIR": str(cache / "triton"), "SGLANG_CACHE_DIR": build_dir}
    return {"home": str(root / "state/home"), "root": str(cache), "sglang_build_dir": build_dir, "env": env}


def test_the_record_says_where_the_caches_live_and_refuses_a_build_dir_outside_them(tmp_path: Path) -> None:
    with_caches = dict(parts("v1", "a" * 40, root=tmp_path), caches=caches_part(_caches(tmp_path, "v1")))
    release = Release(parts=with_caches)
    record = release.to_dict()["parts"]["caches"]
    assert record["sglang_build_dir"] == str(tmp_path / "state/home/cache/sglang/v1")
    assert record["env"]["TRITON_CACHE_DIR"] == str(tmp_path / "state/home/cache/triton")
    assert Release.from_dict(json.loads(json.dumps(release.to_dict()))).parts["caches"] == record
    assert caches_part({}) == {}, "a router-only host has no worker caches"
    outside = dict(_caches(tmp_path, "v1"), sglang_build_dir="/elsewhere/v1")
    with pytest.raises(ReleaseError, match="not under the cache root"):
        caches_part(outside)
    with pytest.raises(ReleaseError, match="absolute home"):
        caches_part(dict(_caches(tmp_path, "v1"), home="relative"))


def test_prune_removes_the_caches_of_a_build_no_kept_release_uses(tmp_path: Path) -> None:
    store = ReleaseStore(tmp_path / "state")
    releases = [
        Release(parts=dict(parts(v, "a" * 40, root=tmp_path), caches=caches_part(_caches(tmp_path, v))))
        for v in ("v1", "v2", "v3")
    ]
    for release in releases:
        _installed(tmp_path, release)
        (Path(release.parts["caches"]["sglang_build_dir"]) / "deep_gemm").mkdir(parents=True)
        store.stage(release)
        store.accept(release.id)
    shared = tmp_path / "state/home/cache/triton"
    shared.mkdir()
    result = store.prune(2, 2, tmp_path / "sglang", tmp_path / "models", free_bytes=lambda _p: 10**12)
    builds = tmp_path / "state/home/cache/sglang"
    assert result.removed_paths == [str(tmp_path / "sglang/v1"), str(builds / "v1")]
    assert sorted(p.name for p in builds.iterdir()) == ["v2", "v3"] and shared.is_dir()


def test_build_id_follows_the_patches_not_the_series_comments(tmp_path: Path) -> None:
    series, locks = tmp_path / "series", tmp_path / "locks"
    series.mkdir()
    locks.mkdir()
    (locks / "py3.11-x86_64.txt").write_text("sglang==0.5.23\n")
    (series / "0001-a.patch").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    (series / "series").write_text("0001-a.patch\n")
    first = build.build_id(series, locks)
    (series / "series").write_text("# a comment\n0001-a.patch\n")
    assert build.build_id(series, locks) == first
    (series / "0001-a.patch").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+c\n")
    assert build.build_id(series, locks) != first


def test_build_id_follows_the_kernels_sources_not_their_build_outputs(tmp_path: Path) -> None:
    """A kernel-only change (a line of pd_kernels, or the distribution's pyproject.toml) names a new
    SGLang venv (a new release, which a rollback undoes); what a build or an editable install leaves in
    the source tree (bytecode, egg-info, build/, dist/) does not."""
    series, locks, kernels = tmp_path / "series", tmp_path / "locks", tmp_path / "kernels"
    package = kernels / "src" / "pd_kernels"
    for d in (series, locks, package / "__pycache__"):
        d.mkdir(parents=True)
    (locks / "py3.11-x86_64.txt").write_text("sglang==0.5.23\n")
    (series / "series").write_text("")
    (kernels / "pyproject.toml").write_text('[project]\nname = "pd-kernels"\nversion = "0.1.0"\n')
    (package / "sparse_mla_decode.py").write_text("BLOCK_N = 32\n")
    first = build.build_id(series, locks, kernels)
    assert first != build.build_id(series, locks)  # the kernels are part of the identity
    (package / "__pycache__" / "sparse_mla_decode.cpython-311.pyc").write_bytes(b"\x00")
    for output in ("src/pd_kernels.egg-info/PKG-INFO", "build/lib/pd_kernels/x.py", "dist/pd_kernels.whl"):
        (kernels / output).parent.mkdir(parents=True, exist_ok=True)
        (kernels / output).write_text("x\n")
    assert build.build_id(series, locks, kernels) == first
    (package / "sparse_mla_decode.py").write_text("BLOCK_N = 64\n")
    second = build.build_id(series, locks, kernels)
    assert second != first
    (kernels / "pyproject.toml").write_text('[project]\nname = "pd-kernels"\nversion = "0.1.1"\n')
    assert build.build_id(series, locks, kernels) not in (first, second)
    with pytest.raises(ReleaseError, match=r"sglang_kernels_dir .* does not exist"):
        build.build_id(series, locks, tmp_path / "missing")


def test_the_host_state_pointers_follow_stage_accept_fail_and_rollback(tmp_path: Path) -> None:
    store = ReleaseStore(tmp_path)
    assert store.pointers() == {"current": None, "status": None, "label": None, "accepted": None}
    one, two = Release(parts=parts("v1", "a" * 40)), Release(parts=parts("v2", "a" * 40))
    store.stage(one)
    assert store.pointers() == {
        "current": one.id,
        "status": "candidate",
        "label": one.label,
        "accepted": None,
    }
    store.accept(one.id)
    store.stage(two)
    assert store.pointers() == {
        "current": two.id,
        "status": "candidate",
        "label": two.label,
        "accepted": one.id,
    }
    store.fail(two.id, "gate")
    assert store.pointers()["status"] == FAILED and store.pointers()["accepted"] == one.id
    store.activate(one.id, "rollback")
    assert ReleaseStore(tmp_path).pointers() == {
        "current": one.id, "status": ACCEPTED, "label": one.label, "accepted": one.id,
    }  # fmt: skip
