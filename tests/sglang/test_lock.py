"""files/locks/sglang-0.5.23: the hashed locks honour every pin of the pinned wheels' own METADATA.

This is CI's check of the supply chain: for each lock (one per Python), every Requires-Dist of the
real sglang, nixl-cu13 and nixl wheels that applies on that Python and machine is in the lock at a
version inside its specifier; every entry is pinned and hashed; the manifest says why a Python has
no lock in uv's words (the wheels' tags decided it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sglang_testlib import ROOT, SGLANG_VERSION, find_sglang_wheel

from lock_requirements import marker_environment, unmet_requirements, wheel_requirements
from pd_appliance.supply import lock

LOCK_DIR = ROOT / "files" / "locks" / f"sglang-{SGLANG_VERSION}"
MANIFEST = json.loads((LOCK_DIR / "manifest.json").read_text())
LOCKS = sorted(MANIFEST["locks"].items())


def _wheel(pattern: str) -> Path:
    for d in [ROOT / "artifacts" / "wheels", Path("/work/wheels")]:
        found = sorted(d.glob(pattern))
        if found:
            return found[0]
    pytest.skip(f"{pattern} is absent; fetch it with: make wheels")


def test_manifest_lists_the_lab_pythons_and_says_why_310_has_none() -> None:
    assert set(MANIFEST["locks"]) == {"3.11", "3.12"}  # Debian 12, Ubuntu 24.04 (and uv's for 22.04)
    assert "cp310" in MANIFEST["unsupported"]["3.10"] and "sglang" in MANIFEST["unsupported"]["3.10"]
    assert MANIFEST["requirements"] == [f"sglang=={SGLANG_VERSION}", "nixl-cu13==1.5.1", "nixl==1.5.1"]
    for name in MANIFEST["locks"].values():
        assert (LOCK_DIR / name).is_file()


@pytest.mark.parametrize(("python", "name"), LOCKS)
def test_every_entry_is_pinned_and_hashed(python: str, name: str) -> None:
    text = (LOCK_DIR / name).read_text()
    entries = lock.parse_lock(text, name)
    assert len(entries) == len(re.findall(r"(?m)^[A-Za-z0-9]", text))
    assert all(e.hashes and all(len(h) == 64 for h in e.hashes) for e in entries.values())
    for requirement in MANIFEST["requirements"]:
        pkg, version = requirement.split("==")
        assert entries[pkg].version == version, f"{name}: {requirement} not pinned as asked"
    for excluded in MANIFEST["excludes"]:
        assert excluded not in entries, f"{name}: {excluded} is excluded but locked"
    assert f"--python {python}" in MANIFEST["command"]


@pytest.mark.parametrize(("python", "name"), LOCKS)
def test_lock_honours_every_requires_dist_of_the_sglang_wheel(python: str, name: str) -> None:
    wheel = find_sglang_wheel()
    if wheel is None:
        pytest.skip("the sglang wheel is absent; fetch it with: make wheels")
    entries = lock.read_lock(LOCK_DIR / name)
    requires = wheel_requirements(wheel)
    assert len(requires) > 100, "read the wheel's METADATA"
    problems = unmet_requirements(entries, requires, marker_environment(python))
    assert [str(p) for p in problems] == []
    # The release pins the appliance relies on (REFERENCE.md): a drift here means a new SGLang.
    assert entries["torch"].version == "2.14.1" and entries["flashinfer-python"].version == "0.7.2"
    assert entries["sglang-kernel"].version == "0.4.10"


@pytest.mark.parametrize(("python", "name"), LOCKS)
def test_lock_honours_the_nixl_wheels(python: str, name: str) -> None:
    entries = lock.read_lock(LOCK_DIR / name)
    env = marker_environment(python)
    cu13 = wheel_requirements(_wheel("nixl_cu13-1.5.1-*.whl"))
    assert {r.split()[0] for r in cu13} == {"torch", "numpy"}
    assert unmet_requirements(entries, cu13, env) == []
    shim = wheel_requirements(_wheel("nixl-1.5.1-py3-none-any.whl"))
    # The shim asks for the CUDA 12 wheel too; the lock leaves it out on purpose, and says so.
    problems = [str(p) for p in unmet_requirements(entries, shim, env)]
    assert problems == ["nixl-cu12==1.5.1: absent from the lock"]
    assert unmet_requirements(entries, shim, env, excluded=MANIFEST["excludes"]) == []


def test_check_catches_a_broken_pin() -> None:
    entries = lock.read_lock(LOCK_DIR / LOCKS[0][1])
    entries["torch"].version = "2.13.0"
    del entries["xgrammar"]
    problems = unmet_requirements(entries, ["torch==2.14.1", "xgrammar==0.2.7", "numpy"], {})
    assert [str(p) for p in problems] == [
        "torch==2.14.1: locked at 2.13.0",
        "xgrammar==0.2.7: absent from the lock",
    ]


def test_marker_and_extra_requirements_apply_only_where_they_should() -> None:
    entries = lock.parse_lock("numpy==2.3.5 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    reqs = [
        'av==16.1.0; platform_machine == "aarch64"',
        'diffusers==0.37.0; extra == "diffusion"',
        'numpy<2; python_version < "3.11"',
    ]
    py312, py310 = marker_environment("3.12"), marker_environment("3.10")
    assert unmet_requirements(entries, reqs, py312) == []
    assert [p.requirement for p in unmet_requirements(entries, reqs, py310)] == [reqs[2]]
    assert len(unmet_requirements(entries, reqs, py312, extras=["diffusion"])) == 1


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("torch>=2\n", "not a pinned requirement"),
        ("torch==2.14.1\n", "has no --hash"),
        (2 * ("a==1 \\\n    --hash=sha256:" + "b" * 64 + "\n"), "pinned twice"),
    ],
)
def test_not_a_lock_is_refused(text: str, match: str) -> None:
    with pytest.raises(lock.LockError, match=match):
        lock.parse_lock(text)


def test_closure_follows_uvs_annotations() -> None:
    entries = lock.read_lock(LOCK_DIR / LOCKS[0][1])
    full = lock.closure(entries, ["nixl-cu13", "nixl"])
    assert {"torch", "numpy", "triton", "nvidia-cublas"} <= set(full)
    assert lock.closure(entries, ["nixl-cu13", "nixl"], stop=["torch"]) == ["nixl", "nixl-cu13", "numpy"]
    everything = lock.closure(entries, [r.split("==")[0] for r in MANIFEST["requirements"]])
    assert sorted(everything) == sorted(entries), "every locked package is reachable from the roots"


def test_render_round_trips_with_hashes() -> None:
    entries = lock.read_lock(LOCK_DIR / LOCKS[0][1])
    text = lock.render(entries, ["sglang", "numpy"])
    again = lock.parse_lock(text)
    assert sorted(again) == ["numpy", "sglang"] and again["sglang"].hashes == entries["sglang"].hashes


def test_unsatisfied_names_what_an_installer_would_change() -> None:
    """The nixl role skips its installer when this is empty: it must see a missing package, another
    version, and names spelled as importlib.metadata spells them (nixl_cu13, NumPy)."""
    entries = lock.read_lock(LOCK_DIR / LOCKS[0][1])
    names = ["nixl-cu13", "nixl", "numpy"]
    held = {
        "nixl_cu13": entries["nixl-cu13"].version,
        "nixl": entries["nixl"].version,
        "NumPy": entries["numpy"].version,
    }
    assert lock.unsatisfied(entries, names, held) == []
    assert lock.unsatisfied(entries, names, {k: v for k, v in held.items() if k != "nixl"}) == ["nixl"]
    assert lock.unsatisfied(entries, names, held | {"NumPy": "0.0.1"}) == ["numpy"]
    with pytest.raises(lock.LockError, match="not in the lock: no-such-package"):
        lock.unsatisfied(entries, ["no-such-package"], held)
