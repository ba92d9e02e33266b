"""Where the tests find the pinned sglang wheel (shared by tests/sglang and tests/tools)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SGLANG_VERSION = "0.5.23"
WHEEL_NAME = f"sglang-{SGLANG_VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
SERIES_DIR = ROOT / "files" / "patches" / "sglang" / SGLANG_VERSION
# How CI (and anyone) gets the wheel; the tests look in PD_SGLANG_WHEEL, PD_WHEEL_DIR,
# <checkout>/artifacts/wheels and /work/wheels, in that order.
DOWNLOAD_HINT = "make wheels (hash-checked against files/locks/sglang-0.5.23/py3.11-x86_64.txt), or: " + (
    "python -m pip download --no-deps --only-binary=:all: --implementation cp --python-version 3.11 "
    f"--platform manylinux_2_34_x86_64 -d artifacts/wheels sglang=={SGLANG_VERSION}"
)


def find_sglang_wheel() -> Path | None:
    """The pinned sglang wheel, or None when it is truly absent."""
    explicit = os.environ.get("PD_SGLANG_WHEEL")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"PD_SGLANG_WHEEL={explicit} does not exist")
        return path
    dirs = [os.environ.get("PD_WHEEL_DIR"), ROOT / "artifacts" / "wheels", "/work/wheels"]
    for d in dirs:
        if d and (Path(d) / WHEEL_NAME).is_file():
            return Path(d) / WHEEL_NAME
    return None


def apply_to_site(site: Path, series: Path = SERIES_DIR, **kw: object) -> object:
    """Apply a patch series to an installed sglang tree, with the marker and pristine copies beside it."""
    from pd_appliance.patches import apply_series

    return apply_series(
        site_packages=site,
        series_dir=series,
        marker=site.parent / "marker.json",
        pristine_dir=site.parent / "pristine",
        package="sglang",
        version=SGLANG_VERSION,
        **kw,
    )
