"""files/constraints/sglang-0.5.23.txt must be exactly the wheel's own dependency set."""

from __future__ import annotations

import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from sglang_testlib import ROOT, SGLANG_VERSION

CONSTRAINTS = ROOT / "files" / "constraints" / f"sglang-{SGLANG_VERSION}.txt"


def _key(req: Requirement) -> tuple[str, str, str]:
    return (canonicalize_name(req.name), str(req.specifier), str(req.marker or ""))


def wheel_requirements(wheel: Path) -> set[tuple[str, str, str]]:
    """Requires-Dist of the wheel, without the optional extras' entries."""
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"sglang-{SGLANG_VERSION}.dist-info/METADATA").decode()
    reqs = set()
    for line in meta.splitlines():
        if line.startswith("Requires-Dist: "):
            req = Requirement(line.removeprefix("Requires-Dist: "))
            if req.marker is None or "extra" not in str(req.marker):
                reqs.add(_key(req))
    return reqs


def constraint_requirements() -> list[Requirement]:
    lines = [ln.split(" #", 1)[0].strip() for ln in CONSTRAINTS.read_text().splitlines()]
    return [Requirement(ln) for ln in lines if ln and not ln.startswith("#")]


def test_constraints_are_valid_pip_constraints() -> None:
    reqs = constraint_requirements()
    assert not [r.name for r in reqs if r.extras], "pip constraints cannot carry extras"
    assert not [r.name for r in reqs if r.url], "pip constraints cannot be URLs"
    names = [canonicalize_name(r.name) for r in reqs]
    assert len(names) == len(set(names)), "a package is constrained twice"
    assert _key(reqs[0]) == ("sglang", f"=={SGLANG_VERSION}", "")


def test_constraints_match_the_wheel_metadata(sglang_wheel: Path) -> None:
    want = wheel_requirements(sglang_wheel)
    have = {_key(r) for r in constraint_requirements() if canonicalize_name(r.name) != "sglang"}
    assert sorted(want - have) == [], "in the wheel's METADATA but not in the constraints file"
    assert sorted(have - want) == [], "in the constraints file but not in the wheel's METADATA"
    pins = {name: spec for name, spec, _ in want}
    # The release pins the appliance relies on (REFERENCE.md): a drift here means a new SGLang.
    assert pins["torch"] == "==2.14.1" and pins["flashinfer-python"] == "==0.7.2"
    assert pins["sglang-kernel"] == "==0.4.10"
