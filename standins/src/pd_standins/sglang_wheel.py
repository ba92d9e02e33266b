"""A stand-in SGLang wheel, its lock and its patch series: a second SGLang version for upgrade rehearsals.

The appliance's release tests upgrade SGLang to another version and back. Only one real version is
pinned (0.5.23), and a real second one would be GBs of CUDA wheels that cannot run here. This builds a
wheel that the sglang role installs exactly as it installs SGLang (from a wheelhouse, against the hash a
lock names, with a patch series applied to it) and that can never be mistaken for SGLang:

- its version carries the local label `+standin` (`0.5.24+standin`): PyPI refuses local versions, so no
  index can ever serve a real SGLang under that name and version;
- its METADATA Summary, its package docstring and every module say STAND-IN, and `python -m
  sglang.launch_server` from it exits 1 saying it cannot serve;
- it holds nothing of SGLang's code: a package `sglang` with a version and one small module the
  stand-in patch series patches.

`build` writes, under OUT: `wheelhouse/` (the wheel, plus copies of the other wheels the lock names),
`locks/sglang-<version>/` (a manifest and a hashed lock per Python: the stand-in sglang plus entries
copied verbatim from a real lock, e.g. NIXL's) and `patches/sglang/<version>/` (a series of one patch).

    python -m pd_standins.sglang_wheel build --out DIR [--version 0.5.24+standin] \
        [--lock-from files/locks/sglang-0.5.23/py3.11-x86_64.txt --keep nixl-cu13 --keep nixl] \
        [--wheel-from artifacts/wheels]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path

DEFAULT_VERSION = "0.5.24+standin"
LABEL = "STAND-IN for SGLang, built by pd_standins.sglang_wheel: not SGLang, it cannot serve"
# A fixed timestamp: the same inputs always give the same wheel bytes, hence the same lock hash.
ZIP_TIME = (2026, 1, 1, 0, 0, 0)
HOOK = "sglang/standin_hook.py"


def _files(version: str) -> dict[str, str]:
    return {
        "sglang/__init__.py": f'"""{LABEL}."""\n\n__version__ = "{version}"\nSTANDIN = True\n',
        "sglang/version.py": f'__version__ = "{version}"\n',
        "sglang/launch_server.py": (
            f'"""{LABEL}."""\n\nimport sys\n\n'
            f'sys.exit("sglang {version} is a {LABEL}; it answers no request. The rehearsal engine'
            ' (pd-sim-worker) serves rehearsals.")\n'
        ),
        HOOK: (
            f'"""{LABEL}: the module the stand-in patch series patches."""\n\n'
            "def hook() -> str:\n"
            '    return "unpatched"\n'
        ),
    }


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(out_dir: Path, version: str = DEFAULT_VERSION) -> Path:
    """Write sglang-<version>-py3-none-any.whl into `out_dir` (byte-identical for the same version)."""
    if "+standin" not in version:
        raise ValueError(
            f"a stand-in version carries the local label +standin (e.g. {DEFAULT_VERSION}), not {version}"
        )
    dist_info = f"sglang-{version}.dist-info"
    files = {name: text.encode() for name, text in _files(version).items()}
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\nSummary: {LABEL}\n"
        "License: Apache-2.0\nRequires-Python: >=3.10\n\n"
        f"{LABEL}. Built for pd-appliance's release rehearsals (a second SGLang version to upgrade to).\n"
    ).encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: pd_standins.sglang_wheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    record += f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return wheel


def series_patch(version: str) -> str:
    """The stand-in series' one patch: a unified diff of the hook module."""
    return (
        f"Stand-in patch series for the {LABEL} {version}.\n\n"
        f"--- a/{HOOK}\n+++ b/{HOOK}\n"
        "@@ -3,2 +3,2 @@\n"
        " def hook() -> str:\n"
        '-    return "unpatched"\n'
        '+    return "patched by the stand-in series"\n'
    )


def lock_entries(lock_text: str, keep: Sequence[str]) -> str:
    """The entries named `keep` of a uv lock, verbatim (pin, hashes, `# via` lines)."""
    wanted = {k.lower().replace("_", "-") for k in keep}
    out: list[str] = []
    current: list[str] | None = None
    for line in lock_text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            name = line.split("==", 1)[0].strip().lower().replace("_", "-")
            current = [] if name in wanted else None
            if current is not None:
                out.append(line)
            continue
        if current is not None and line.strip():
            out.append(line)
    found = {ln.split("==", 1)[0].lower() for ln in out if ln and not ln[0].isspace()}
    if missing := wanted - found:
        raise ValueError(f"not in the lock: {', '.join(sorted(missing))}")
    return "\n".join(out) + "\n"


def build(
    out: Path,
    version: str = DEFAULT_VERSION,
    lock_from: Path | None = None,
    keep: Sequence[str] = (),
    wheel_from: Path | None = None,
    python: str = "3.11",
) -> dict[str, str]:
    """The wheelhouse, lock directory and patch series of the stand-in version; returns their paths."""
    wheelhouse = out / "wheelhouse"
    wheel = build_wheel(wheelhouse, version)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock_dir = out / "locks" / f"sglang-{version}"
    lock_dir.mkdir(parents=True, exist_ok=True)
    lock_name = f"py{python}-x86_64.txt"
    text = f"# {LABEL}: a lock for release rehearsals.\nsglang=={version} \\\n    --hash=sha256:{digest}\n"
    text += "    # via -r requirements.in\n"
    if lock_from is not None and keep:
        text += lock_entries(lock_from.read_text(), keep)
    (lock_dir / lock_name).write_text(text)
    manifest = {
        "standin": LABEL,
        "requirements": [f"sglang=={version}", *keep],
        "machine": "x86_64",
        "locks": {python: lock_name},
        "unsupported": {},
    }
    (lock_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if wheel_from is not None:
        for name in keep:
            for found in wheel_from.glob(f"{name.replace('-', '_')}-*.whl"):
                shutil.copy2(found, wheelhouse / found.name)
    series = out / "patches" / "sglang" / version
    series.mkdir(parents=True, exist_ok=True)
    (series / "0001-standin-hook.patch").write_text(series_patch(version))
    (series / "series").write_text("0001-standin-hook.patch\n")
    return {
        "wheel": str(wheel),
        "wheelhouse": str(wheelhouse),
        "lock_dir": str(lock_dir),
        "series_dir": str(series),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pd_standins.sglang_wheel", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="wheel, wheelhouse, lock and patch series of a stand-in SGLang version")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--version", default=DEFAULT_VERSION)
    b.add_argument("--lock-from", type=Path, help="a real lock to copy --keep entries from (hashes and all)")
    b.add_argument("--keep", action="append", default=[], help="a package of --lock-from to lock too")
    b.add_argument("--wheel-from", type=Path, help="a directory holding the --keep wheels for the wheelhouse")
    b.add_argument("--python", default="3.11")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.out, args.version, args.lock_from, args.keep, args.wheel_from, args.python)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
