"""Build one of the checkout's wheels into a shared directory without racing another build.

    python -m pd_appliance.supply.wheel_build --source . --out artifacts/build/pd-appliance-wheel \
        [--no-build-isolation] [--name pd_appliance]

The appliance_tools role builds pd_appliance (the tools venv's) with it, the sglang role pd_kernels
(kernels/: the SGLang venv's kernels); --name is the wheel's file-name prefix.

Two plays on one checkout (molecule's scenarios run side by side) used to empty the shared build
directory and build into it: one play's copy of the wheel could find the directory emptied by the
other. Each build now writes into its own scratch directory inside `--out` and moves the wheel in
with os.replace (atomic on one filesystem; the build is reproducible, so two builds of the same
sources write the same bytes), then removes any other wheel of that name there. Prints the wheel's
path. SOURCE_DATE_EPOCH comes from the caller's environment.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def build(
    source: Path, out: Path, isolation: bool = True, python: str = sys.executable, name: str = "pd_appliance"
) -> Path:
    """pip wheel `source` into a scratch directory of `out`, then move the one `name` wheel into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    try:
        argv = [python, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(scratch)]
        subprocess.run([*argv, *([] if isolation else ["--no-build-isolation"]), str(source)], check=True)
        wheels = sorted(scratch.glob(f"{name}-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"pip wheel in {source} produced {len(wheels)} {name} wheels: {wheels}")
        target = out / wheels[0].name
        os.replace(wheels[0], target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for other in out.glob(f"{name}-*.whl"):
        if other.name != target.name:
            other.unlink(missing_ok=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pd_appliance.supply.wheel_build", description=__doc__.split("\n")[0]
    )
    p.add_argument("--source", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--no-build-isolation", dest="isolation", action="store_false")
    p.add_argument("--name", default="pd_appliance", help="the wheel's file-name prefix (pd_kernels)")
    args = p.parse_args(argv)
    print(build(args.source, args.out, args.isolation, name=args.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
