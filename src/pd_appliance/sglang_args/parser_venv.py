"""A venv with the real SGLang wheel, patched like the lab's, and only what its parser imports.

`python -m sglang.launch_server` builds its parser in `sglang.srt.server_args`, whose imports
pull in torch, triton, numpy and a dozen small packages (files/sglang/<version>/
parser-requirements.txt lists them, found by importing it from the wheel installed without
dependencies). SGLang's other 70 dependencies (CUDA kernels, FlashInfer, transformers, ...) are
not needed to parse a command line and are not installed: the wheel goes in with --no-deps, the
requirements list is complete and exact, and torch is the CPU build.

The venv lives under a cache directory, named by a hash of everything it is made of: the wheel's
sha256, the requirements file, the patch series, the base Python's version and this module's
format. The same inputs reuse it; changed inputs build a new one and remove the old ones. A
lock file serialises builders; `.complete` is written last, so a half-built venv is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pd_appliance.patches import apply_series
from pd_appliance.supply.pip_sources import pip_sources_as_uv_flags

BUILD_FORMAT = 1
COMPLETE = ".complete"


class ParserVenvError(RuntimeError):
    """The parser venv cannot be built; the message names the input at fault."""


@dataclass(frozen=True)
class ParserVenvInputs:
    """What the venv is made of."""

    wheel: Path
    requirements: Path
    series_dir: Path
    sglang_version: str
    base_python: str = sys.executable

    def key(self) -> str:
        digest = hashlib.sha256()
        digest.update(f"format={BUILD_FORMAT}\n".encode())
        digest.update(_python_version(self.base_python).encode())
        digest.update(_sha256(self.wheel).encode())
        digest.update(self.requirements.read_bytes())
        for path in sorted(p for p in self.series_dir.iterdir() if p.is_file()):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()[:16]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _python_version(python: str) -> str:
    result = subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ParserVenvError(f"cannot run {python}: {result.stderr.strip()}")
    return result.stdout


def _run(cmd: list[str], what: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = result.stdout[-2000:] + result.stderr[-4000:]
        raise ParserVenvError(f"{what} failed ({' '.join(cmd)}):\n{output}")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _installer(venv: Path) -> list[str]:
    """uv when the running Python's venv has it (a dev dependency: it installs the ~40 packages,
    CPU torch among them, in parallel and from its cache), else pip; both with --no-deps."""
    uv = Path(sys.executable).parent / "uv"
    if uv.is_file() and os.access(uv, os.X_OK):
        python = str(venv_python(venv))
        return [
            str(uv),
            "pip",
            "install",
            "-q",
            "--python",
            python,
            *pip_sources_as_uv_flags(python),
            "--no-deps",
        ]
    return [str(venv_python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
            "--no-compile"]  # fmt: skip


def _build(inputs: ParserVenvInputs, venv: Path, log: Callable[[str], None]) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    _run([inputs.base_python, "-m", "venv", str(venv)], "creating the venv")
    pip = _installer(venv)
    log(f"installing {inputs.requirements.name} (--no-deps: the list is complete)")
    _run([*pip, "--requirement", str(inputs.requirements)], f"installing {inputs.requirements}")
    log(f"installing {inputs.wheel.name} (--no-deps)")
    _run([*pip, str(inputs.wheel)], f"installing {inputs.wheel}")
    site = sorted(venv.glob("lib/python3*/site-packages"))
    if len(site) != 1:
        raise ParserVenvError(f"{venv}: expected one lib/python3*/site-packages, found {len(site)}")
    result = apply_series(
        site[0], inputs.series_dir, venv / "pd-patch-series.json", venv / "pd-patch-pristine",
        "sglang", inputs.sglang_version, wheel=inputs.wheel,
    )  # fmt: skip
    log(f"patch series: {result.action} ({', '.join(p['name'] for p in result.patches) or 'none'})")


def ensure_parser_venv(
    inputs: ParserVenvInputs, cache_dir: Path, log: Callable[[str], None] = lambda _: None
) -> Path:
    """The python of the venv for `inputs` under `cache_dir`, built when absent (see module doc)."""
    for path, what in ((inputs.wheel, "wheel"), (inputs.requirements, "requirements file")):
        if not path.is_file():
            raise ParserVenvError(f"the {what} {path} does not exist")
    if not (inputs.series_dir / "series").is_file():
        raise ParserVenvError(f"{inputs.series_dir} has no series file")
    cache_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"sglang-{inputs.sglang_version}-parser-"
    venv = cache_dir / f"{prefix}{inputs.key()}"
    with (cache_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / COMPLETE).is_file():
            log(f"building {venv}")
            _build(inputs, venv, log)
            inputs_record = {
                "wheel": str(inputs.wheel), "wheel_sha256": _sha256(inputs.wheel),
                "requirements": str(inputs.requirements), "series_dir": str(inputs.series_dir),
            }  # fmt: skip
            (venv / COMPLETE).write_text(json.dumps(inputs_record, indent=1) + "\n")
            for old in cache_dir.glob(f"{prefix}*"):
                if old != venv and old.is_dir():
                    log(f"removing the outdated {old}")
                    shutil.rmtree(old, ignore_errors=True)
    return venv_python(venv)
