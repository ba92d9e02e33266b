"""The tools, nixl and sglang roles converge against the rehearsal inventory, for real, and a second
run changes nothing.

The lab path runs as it is, with the one declared switch off (sglang_install_cuda_stack: false, the
CUDA stack cannot be installed here): the Python is chosen from the locks, uv comes from its hashed
pin, the whole lock for that Python is proven against PyPI package by package and hash by hash, and
sglang, nixl-cu13, the nixl shim, numpy and the pd-kernels wheel (kernels/) are installed from it with
uv in hash-checking mode; the patch series is applied to the real sglang wheel by the real module.

The first run is the shared site converge (tests/converged_site.py); the second is
tests/foundation/test_site_modes.py's `--tags provision` on it, which must change nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_testlib import ROOT, SERIES_DIR, SGLANG_VERSION

from converged_site import ConvergedSite
from pd_testlib import REHEARSAL_FILTER_PLUGINS


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env["ANSIBLE_FILTER_PLUGINS"] = REHEARSAL_FILTER_PLUGINS
    return env


def _ansible(args: list[str], binary: str = "ansible-playbook") -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / binary
    return subprocess.run(
        [str(exe), *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1500, check=False
    )


@pytest.fixture(scope="module")
def rehearsal(converged_site: ConvergedSite) -> dict[str, object]:
    return {"root": converged_site.root, "first": converged_site.require_deploy()}


def sglang_venv(home: Path) -> Path:
    """The SGLang venv of this release: one per version and build, <home>/sglang/<version>-<build>."""
    [venv] = (home / "sglang").glob(f"{SGLANG_VERSION}-*")
    return venv


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_first_run_installs_patches_and_records(rehearsal) -> None:
    run = rehearsal["first"]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    out = " ".join(run.stdout.split())  # the YAML callback folds long messages
    # The lab path runs here, only the declared switch is off: no task of these roles takes a
    # rehearsal path (the NIXL check's own file, check.yml, is another change's).
    blocks = re.split(r"\nTASK \[", run.stdout)
    ours = [b for b in blocks if b.startswith(("sglang :", "nixl :")) and "host memory" not in b[:80]]
    assert len(ours) > 20 and not [b.split("]")[0] for b in ours if "REHEARSAL" in b]
    versions = json.loads((rehearsal["root"] / "var/lib/pd-appliance/sglang-versions.json").read_text())
    lock = ROOT / "files" / "locks" / f"sglang-{SGLANG_VERSION}" / versions["lock"]  # this host's Python's
    python = versions["python"].split()[0]
    assert lock.name == f"py{python}-x86_64.txt" and versions["python"].endswith("(host)")
    locked = len(re.findall(r"(?m)^[a-z0-9][a-z0-9._-]*==", lock.read_text()))
    proven = f"{locked} locked packages proven against https://pypi.org/simple/ for Python {python}"
    assert proven in out, out[-3000:]
    home = rehearsal["root"] / "opt" / "pd-appliance"
    marker = json.loads((sglang_venv(home) / "pd-appliance-patches.json").read_text())
    assert [p["name"] for p in marker["patches"]] == [
        ln.strip() for ln in (SERIES_DIR / "series").read_text().splitlines() if ln.strip() and ln[0] != "#"
    ]
    [site] = sglang_venv(home).glob("lib/python3*/site-packages")
    assert "force_env(" in (site / "sglang/srt/arg_groups/model_hook.py").read_text()
    assert list((site / "sglang/srt/arg_groups/__pycache__").glob("model_hook.*.pyc")), "byte-compiled"
    assert versions["versions"]["sglang"] == SGLANG_VERSION and versions["versions"]["nixl"] == "1.5.1"
    assert versions["versions"]["torch"] is None and "torch" in versions["missing"]
    assert versions["versions"]["pd-kernels"] == "0.1.0" and "pd-appliance" not in versions["versions"]
    assert versions["installer"] == "uv" and versions["lock"] == lock.name and versions["cuda_stack"] is False
    # Exactly the CUDA-free part of the lock went in, each at its locked version and from a hashed file.
    [venv_site] = sglang_venv(home).glob("lib/python3*/site-packages")
    installed = {p.name.split("-")[0].lower() for p in venv_site.glob("*.dist-info")}
    assert installed >= {"sglang", "nixl_cu13", "nixl", "numpy", "pd_kernels"}
    assert not installed & {"torch", "flashinfer_python", "sglang_kernel", "triton", "pd_appliance"}
    nixl_py = sglang_venv(home) / "bin" / "python"
    probe = "import nixl, nixl._api; from nixl._api import nixl_agent; print('ok')"
    assert subprocess.run([str(nixl_py), "-c", probe], capture_output=True, text=True).stdout.strip() == "ok"
    # Patch 0002 imports pd_kernels on first use of pd_splitkv; pd_appliance is not in this venv.
    probe = "import importlib.util as u, pd_kernels; print(u.find_spec('pd_appliance') is None)"
    kernels = subprocess.run([str(nixl_py), "-c", probe], capture_output=True, text=True)
    assert kernels.stdout.strip() == "True", kernels.stderr
    assert (home / "tools" / "bin" / "uv").exists(), "uv comes from its hashed pin into the tools venv"
    tools_py = home / "tools" / "bin" / "python"
    probe = "import pd_appliance.patches, pynvml, huggingface_hub, supervisor"
    assert subprocess.run([str(tools_py), "-c", probe], check=False).returncode == 0
    smg = subprocess.run([str(home / "router" / "bin" / "smg"), "--version"], capture_output=True, text=True)
    assert "1.13.0" in smg.stdout


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_module_fails_naming_patch_and_hunk_on_the_installed_venv(rehearsal, tmp_path: Path) -> None:
    assert rehearsal["first"].returncode == 0
    home = rehearsal["root"] / "opt" / "pd-appliance"
    [site] = sglang_venv(home).glob("lib/python3*/site-packages")
    series = tmp_path / "series"
    shutil.copytree(SERIES_DIR, series)
    target = "sglang/srt/arg_groups/model_hook.py"
    (series / "0090-broken.patch").write_text(
        f"deliberately broken\n\n--- a/{target}\n+++ b/{target}\n@@ -3,1 +3,1 @@\n-no such line\n+x\n"
    )
    with (series / "series").open("a") as fh:
        fh.write("0090-broken.patch\n")
    before = (site / target).read_bytes()
    args = " ".join(
        [
            f"site_packages={site}",
            f"series_dir={series}",
            f"marker={sglang_venv(home) / 'pd-appliance-patches.json'}",
            f"pristine_dir={sglang_venv(home) / 'pd-appliance-pristine'}",
            f"version={SGLANG_VERSION}",
        ]
    )
    run = _ansible(
        [
            "localhost",
            "-m",
            "pd_sglang_patch_series",
            "-a",
            args,
            "-e",
            f"ansible_python_interpreter={home}/tools/bin/python",
        ],
        binary="ansible",
    )
    assert run.returncode != 0
    assert "0090-broken.patch: hunk #1 (@@ -3,1 +3,1 @@) does not apply to" in run.stdout
    assert (site / target).read_bytes() == before, "a failing series must not touch the installed files"
