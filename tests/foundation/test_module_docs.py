"""Every appliance module's DOCUMENTATION, EXAMPLES and RETURN are YAML ansible-doc can read.

ansible-lint only prints "[ERROR]: Unable to parse documentation" and passes: a colon in a plain
description line (`small text files: pidfiles`) broke pd_host_read's and, before, pd_bench_report's,
and `ansible-doc` showed nothing for them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from pd_testlib import ROOT

MODULES = sorted((ROOT / "plugins/modules").glob("*.py"))


def _doc_blocks(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in {"DOCUMENTATION", "EXAMPLES", "RETURN"}
        and isinstance(node.value, ast.Constant)
    }


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_the_module_documents_itself_in_yaml(path: Path) -> None:
    blocks = _doc_blocks(path)
    assert "DOCUMENTATION" in blocks, f"{path.name} has no DOCUMENTATION"
    documentation = yaml.safe_load(blocks["DOCUMENTATION"])
    assert documentation["module"] == path.stem and documentation["short_description"]
    for name in ("EXAMPLES", "RETURN"):
        if name in blocks:
            yaml.safe_load(blocks[name])
