"""Patch 0001 against the real wheel: the patched sm_120 branch of model_hook.py, run for real.

model_hook.py itself needs torch to import, so the test runs the patched module's sm_120 branch
in isolation: the branch body is taken from the patched file's syntax tree and executed with the
wheel's own sglang/srt/environ.py and the patch's sm120_env.py (both stdlib-only). sglang's
__init__ (which imports torch) is bypassed by registering a bare package for `sglang`.
"""

from __future__ import annotations

import ast
import importlib
import logging
import os
import sys
import types
from pathlib import Path

import pytest
from sglang_testlib import SERIES_DIR, SGLANG_VERSION

from pd_appliance.patches import apply_series

BRANCH_VARS = {
    # name: (sm_120 value, kind)
    "SGLANG_OPT_FP8_WO_A_GEMM": ("False", "default"),
    "SGLANG_OPT_USE_TOPK_V2": ("False", "forced"),
    "SGLANG_OPT_USE_TILELANG_MHC_PRE": ("False", "default"),
    "SGLANG_OPT_FUSE_MHC_POST_PRE": ("True", "default"),
    "SGLANG_OPT_DEEPGEMM_HC_PRENORM": ("False", "default"),
    "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": ("True", "default"),
    "SGLANG_OPT_USE_TILELANG_INDEXER": ("True", "default"),
}


def _body_text(node: ast.If) -> str:
    """The branch's own statements, without its elif/else arms."""
    return "\n".join(ast.unparse(stmt) for stmt in node.body)


def _sm120_branch(model_hook: Path) -> ast.If:
    tree = ast.parse(model_hook.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and ast.unparse(node.test) == "get_platform().is_sm120"
            and "SGLANG_OPT_USE_TOPK_V2" in _body_text(node)
        ):
            return node
    raise AssertionError("the DeepSeek-V4 sm_120 branch is not in model_hook.py")


@pytest.fixture
def patched(site_packages: Path, monkeypatch: pytest.MonkeyPatch):
    apply_series(
        site_packages,
        SERIES_DIR,
        site_packages.parent / "m.json",
        site_packages.parent / "p",
        "sglang",
        SGLANG_VERSION,
    )
    for name in BRANCH_VARS:
        monkeypatch.delenv(name, raising=False)  # restored at teardown, whatever the branch set
    for mod in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, mod)
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(site_packages / "sglang")]
    monkeypatch.setitem(sys.modules, "sglang", pkg)
    yield site_packages
    for mod in [m for m in sys.modules if m.startswith("sglang.")]:
        sys.modules.pop(mod, None)


def _run_branch(site: Path) -> None:
    branch = _sm120_branch(site / "sglang/srt/arg_groups/model_hook.py")
    code = compile(ast.Module(body=branch.body, type_ignores=[]), "model_hook.py:sm120", "exec")
    envs = importlib.import_module("sglang.srt.environ").envs
    exec(code, {"envs": envs})


def test_unpatched_branch_silently_overrides_the_operator(site_packages: Path, monkeypatch, caplog) -> None:
    """The defect, shown on the pristine file: the operator's TOPK_V2=1 vanishes without a log line."""
    monkeypatch.setenv("SGLANG_OPT_USE_TOPK_V2", "1")
    for mod in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, mod)
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(site_packages / "sglang")]
    monkeypatch.setitem(sys.modules, "sglang", pkg)
    for name in BRANCH_VARS:
        if name != "SGLANG_OPT_USE_TOPK_V2":
            monkeypatch.delenv(name, raising=False)
    try:
        with caplog.at_level(logging.DEBUG):
            _run_branch(site_packages)
        assert os.environ["SGLANG_OPT_USE_TOPK_V2"] == "False"
        assert not [r for r in caplog.records if "SGLANG_OPT_USE_TOPK_V2" in r.getMessage()]
    finally:
        for mod in [m for m in sys.modules if m.startswith("sglang.")]:
            sys.modules.pop(mod, None)


def test_every_override_is_logged_with_the_value_in_effect(patched: Path, caplog) -> None:
    with caplog.at_level(logging.INFO):
        _run_branch(patched)
    for name, (value, _kind) in BRANCH_VARS.items():
        assert os.environ[name] == value
        lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
        assert len(lines) == 1, f"{name}: expected one log line, got {lines}"
        assert value in lines[0] and "unset" in lines[0]


def test_operator_values_win_over_defaults(patched: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "0")
    monkeypatch.setenv("SGLANG_OPT_USE_TILELANG_INDEXER", "0")
    monkeypatch.setenv("SGLANG_OPT_FUSE_MHC_POST_PRE", "true")
    with caplog.at_level(logging.INFO):
        _run_branch(patched)
    assert os.environ["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == "0"
    assert os.environ["SGLANG_OPT_USE_TILELANG_INDEXER"] == "0"
    assert os.environ["SGLANG_OPT_FUSE_MHC_POST_PRE"] == "true"
    kept = [r for r in caplog.records if "SGLANG_OPT_USE_TILELANG_INDEXER" in r.getMessage()]
    assert kept[0].levelno == logging.WARNING
    assert "keeping operator's SGLANG_OPT_USE_TILELANG_INDEXER='0'" in kept[0].getMessage()
    assert "would be True" in kept[0].getMessage()


def test_hardware_limit_overrides_the_operator_loudly(patched: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("SGLANG_OPT_USE_TOPK_V2", "1")
    with caplog.at_level(logging.INFO):
        _run_branch(patched)
    assert os.environ["SGLANG_OPT_USE_TOPK_V2"] == "False"
    envs = importlib.import_module("sglang.srt.environ").envs
    assert envs.SGLANG_OPT_USE_TOPK_V2.get() is False
    [rec] = [r for r in caplog.records if "SGLANG_OPT_USE_TOPK_V2" in r.getMessage()]
    assert rec.levelno == logging.WARNING
    msg = rec.getMessage()
    assert "OVERRIDING operator's SGLANG_OPT_USE_TOPK_V2='1' with False" in msg
    assert "99 KB" in msg and "hardware limit" in msg


def test_patched_branch_sets_nothing_directly(patched: Path) -> None:
    """Every write in the sm_120 branch goes through default_env/force_env: none can be silent."""
    branch = _body_text(_sm120_branch(patched / "sglang/srt/arg_groups/model_hook.py"))
    assert ".set(" not in branch
    assert branch.count("force_env(") == 1 and branch.count("default_env(") == 6
