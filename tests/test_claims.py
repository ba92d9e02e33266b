"""docs/claims.md: every README promise names a test that exists (fast: no subprocess, no import).

Each table row of docs/claims.md is a claim; its second column names the tests that prove it, in
backticks: `tests/<path>.py::test_name` (or `::Class::test_name`), checked against the file's AST,
or `molecule/<scenario>/<file>.yml` (optionally `::<task name>`), checked against the file and the
names of its tasks. A row without a test, or naming a test, file or task that does not exist,
fails here, so a renamed or deleted test cannot leave a claim unproven silently.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "claims.md"
# The areas the issue asks the table to cover (docs/claims.md section titles start with these).
AREAS = (
    "Refusals",
    "Faults",
    "Security",
    "Supply chain",
    "Releases",
    "Tuning",
    "Gates",
    "Serving, topologies and day-2",
)
REFERENCE = re.compile(r"`((?:tests|molecule)/[^`]+)`")


@dataclass(frozen=True)
class Claim:
    section: str
    line: int
    text: str
    tests: tuple[str, ...]
    fails_when: str


def parse_claims(markdown: str) -> list[Claim]:
    """Every table row under a `## ` section, except header and separator rows."""
    claims, section = [], ""
    for number, line in enumerate(markdown.splitlines(), start=1):
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        if not line.startswith("|") or re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if cells[0] == "claim":
            continue
        tests = tuple(REFERENCE.findall(cells[1])) if len(cells) > 1 else ()
        claims.append(Claim(section, number, cells[0], tests, cells[2] if len(cells) > 2 else ""))
    return claims


@cache
def _python_tests(path: Path) -> frozenset[str]:
    """`name` and `Class::name` of every test function the file defines (its AST; nothing imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test")
            }
    return frozenset(names)


def _task_names(node: Any) -> set[str]:
    """Names of every play and task in a playbook (blocks, rescue, always, handlers included)."""
    names: set[str] = set()
    if isinstance(node, list):
        for item in node:
            names |= _task_names(item)
    elif isinstance(node, dict):
        if isinstance(node.get("name"), str):
            names.add(node["name"])
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            names |= _task_names(node.get(key))
    return names


@cache
def _molecule_tasks(path: Path) -> frozenset[str]:
    return frozenset(_task_names(yaml.safe_load(path.read_text(encoding="utf-8"))))


def reference_problem(reference: str, root: Path = ROOT) -> str | None:
    """Why `reference` names nothing that exists (None when it does)."""
    file, _, name = reference.partition("::")
    path = root / file
    if file.startswith("tests/"):
        if not (file.endswith(".py") and Path(file).name.startswith("test_")):
            return f"{reference}: not a test file (tests/<path>/test_*.py)"
        if not path.is_file():
            return f"{reference}: {file} does not exist"
        if not name:
            return f"{reference}: name the test (::test_name), not only the file"
        if name.split("[")[0] not in _python_tests(path):
            return f"{reference}: {file} defines no test {name}"
        return None
    if not re.fullmatch(r"molecule/[\w-]+/[\w-]+\.yml", file):
        return f"{reference}: not molecule/<scenario>/<file>.yml"
    if not path.is_file():
        return f"{reference}: {file} does not exist"
    if name and name not in _molecule_tasks(path):
        return f"{reference}: {file} has no play or task named {name!r}"
    return None


def claim_problems(claims: list[Claim], root: Path = ROOT) -> list[str]:
    problems = []
    for claim in claims:
        where = f"docs/claims.md:{claim.line} ({claim.section}: {claim.text[:60]})"
        if not claim.tests:
            problems.append(f"{where}: names no test")
        if not claim.fails_when:
            problems.append(f"{where}: says no input that makes its test fail")
        problems += [f"{where}: {p}" for ref in claim.tests if (p := reference_problem(ref, root))]
    return problems


def test_every_claim_names_tests_that_exist() -> None:
    claims = parse_claims(CLAIMS.read_text(encoding="utf-8"))
    assert len(claims) >= 60, f"only {len(claims)} claims parsed from {CLAIMS}"
    assert claim_problems(claims) == []


def test_every_area_of_the_readme_has_its_table() -> None:
    sections = {claim.section for claim in parse_claims(CLAIMS.read_text(encoding="utf-8"))}
    missing = [area for area in AREAS if not any(s.startswith(area) for s in sections)]
    assert missing == [], f"docs/claims.md has no claims under {missing}"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("| a claim | no test named | x |", "names no test"),
        ("| a claim | `tests/test_claims.py::test_that_does_not_exist` | x |", "defines no test"),
        ("| a claim | `tests/nowhere/test_gone.py::test_x` | x |", "does not exist"),
        ("| a claim | `tests/test_claims.py` | x |", "name the test"),
        ("| a claim | `tests/pd_testlib.py::free_ports` | x |", "not a test file"),
        ("| a claim | `molecule/default/verify.yml::No such task` | x |", "has no play or task named"),
        ("| a claim | `molecule/nowhere/verify.yml` | x |", "does not exist"),
        ("| a claim | `tests/test_claims.py::test_every_claim_names_tests_that_exist` |  |", "says no input"),
    ],
)
def test_the_check_catches_a_claim_without_a_real_test(row: str, problem: str) -> None:
    claims = parse_claims(f"## Area\n\n| claim | test | fails when |\n| --- | --- | --- |\n{row}\n")
    assert len(claims) == 1
    problems = claim_problems(claims)
    assert len(problems) == 1 and problem in problems[0], problems


def test_the_check_accepts_real_tests_methods_and_molecule_tasks(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("class TestA:\n    def test_b(self):\n        pass\n")
    assert reference_problem("tests/test_x.py::TestA::test_b", tmp_path) is None
    assert reference_problem("tests/test_x.py::test_b", tmp_path) is not None
    assert (
        reference_problem("tests/test_claims.py::test_the_check_catches_a_claim_without_a_real_test[x]")
        is None
    )
    assert reference_problem("molecule/default/verify.yml") is None
