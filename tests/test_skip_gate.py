"""The skip gate (tests/skip_gate.py): an undeclared skip fails the run when CI asks, a declared one does
not, and every skip is listed either way; also under xdist (the workers' reports reach the controller)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skip_gate import DECLARED_FILE, ENV, Declared, load_declared

HERE = Path(__file__).resolve().parent

SAMPLE = """
import pytest

def test_runs():
    pass

def test_skips_for_a_missing_tool():
    pytest.skip("promtool is absent")
"""


def _pytest(tmp_path: Path, *args: str, enforce: bool) -> subprocess.CompletedProcess[str]:
    """A pytest run of SAMPLE in its own rootdir with the gate loaded as a plugin."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = str(HERE)
    if enforce:
        env[ENV] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "skip_gate", "-p", "no:cacheprovider", *args,
         "test_sample.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_an_undeclared_skip_fails_the_run_only_when_enforced(tmp_path: Path) -> None:
    relaxed = _pytest(tmp_path, enforce=False)
    assert relaxed.returncode == 0, relaxed.stdout
    assert "UNDECLARED test_sample.py::test_skips_for_a_missing_tool: promtool is absent" in relaxed.stdout
    enforced = _pytest(tmp_path, enforce=True)
    assert enforced.returncode == 1, enforced.stdout
    assert "skips: 1, undeclared: 1" in enforced.stdout
    assert f"{ENV}=1: 1 skip(s) not declared" in enforced.stdout


def test_the_controller_sees_the_workers_skips(tmp_path: Path) -> None:
    # A whole module skipped at collection (a missing import) counts too.
    (tmp_path / "test_module_skip.py").write_text('import pytest\npytest.importorskip("pd_no_such_module")\n')
    enforced = _pytest(tmp_path, "-n", "2", "test_module_skip.py", enforce=True)
    assert enforced.returncode == 1, enforced.stdout
    assert "UNDECLARED test_sample.py::test_skips_for_a_missing_tool: promtool is absent" in enforced.stdout
    assert "UNDECLARED test_module_skip.py: could not import 'pd_no_such_module'" in enforced.stdout
    assert "skips: 2, undeclared: 2" in enforced.stdout


def test_a_declared_test_skipping_for_another_reason_is_undeclared() -> None:
    gpu = Declared("tests/gpu/test_nvml_on_gpu.py::*", "no NVIDIA driver on this machine", "needs a GPU")
    assert gpu.covers("tests/gpu/test_nvml_on_gpu.py::test_x", "no NVIDIA driver on this machine (runs ...)")
    assert not gpu.covers("tests/gpu/test_nvml_on_gpu.py::test_x", "pynvml is missing")
    assert not gpu.covers("tests/gpu/test_gpu_facts.py::test_x", "no NVIDIA driver on this machine")


def test_the_declared_list_is_gpu_and_benchmark_only(tmp_path: Path) -> None:
    declared = load_declared(DECLARED_FILE)
    assert {d.pattern.split("::")[0] for d in declared} == {
        "tests/gpu/test_nvml_on_gpu.py", "tests/kernels/test_sparse_mla_decode.py",
        "tests/faults/test_reference.py",
    }  # fmt: skip
    for d in declared:
        assert list(HERE.parent.glob(d.pattern.split("::")[0])), f"{d.pattern} names no file"
    bad = tmp_path / "declared.yml"
    bad.write_text("- {pattern: 'tests/*', why: everything}\n")
    with pytest.raises(ValueError, match="pattern, because and why"):
        load_declared(bad)
