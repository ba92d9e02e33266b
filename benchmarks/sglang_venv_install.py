"""What uv buys: the full SGLang venv installed from the same hashed lock and the same local
wheelhouse with uv and with pip, cold installer caches, in one run.

Each installer gets a fresh venv (made by the same Python, not timed) and a fresh, empty cache
directory; the wheelhouse is read once before each install so both find it equally in the page
cache. Both install exactly what the sglang role installs: ``--no-deps --require-hashes`` from the
lock, offline (``--no-index --find-links WHEELHOUSE``). pip byte-compiles by default and uv does
not, so uv is also timed with ``--compile-bytecode`` (the like-for-like figure). Results (times,
ratios against pip, date, machine, commit, versions) go to benchmarks/results/.

    # once: the wheelhouse (about 4.2 GB for Python 3.11)
    pip download --no-deps --require-hashes --only-binary=:all: \\
        -r files/locks/sglang-0.5.23/py3.11-x86_64.txt -d artifacts/wheelhouse/cp311
    python benchmarks/sglang_venv_install.py --python /usr/bin/python3.11 \\
        --wheelhouse artifacts/wheelhouse/cp311
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK_DIR = ROOT / "files" / "locks" / "sglang-0.5.23"


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def clean_env() -> dict[str, str]:
    """The caller's environment without pip/uv settings (this machine's pip.conf adds find-links and
    constraints); each run then sets its own cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def warm(wheelhouse: Path) -> int:
    """Read every wheel once (same page-cache state before each install); returns the bytes read."""
    total = 0
    for path in sorted(wheelhouse.glob("*.whl")):
        with path.open("rb") as fh:
            while block := fh.read(16 << 20):
                total += len(block)
    return total


def timed_install(name: str, python: str, argv_for, work: Path, wheelhouse: Path) -> dict[str, object]:
    """Fresh venv and cache, warm wheelhouse, then the timed install; the venv is removed after."""
    venv, cache = work / f"venv-{name}", work / f"cache-{name}"
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    _run([python, "-m", "venv", str(venv)])
    warm(wheelhouse)
    env = clean_env()
    argv = argv_for(venv / "bin" / "python", cache)
    start = time.perf_counter()
    out = _run(argv, env)
    seconds = time.perf_counter() - start
    count = len(list((venv / "lib").glob("python3*/site-packages/*.dist-info")))
    size = int(_run(["du", "-sb", str(venv)]).split()[0])
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return {
        "seconds": round(seconds, 1),
        "dists": count,
        "venv_bytes": size,
        "tail": out.strip().splitlines()[-1:],
    }


def machine() -> dict[str, object]:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in ln
        ),
        platform.processor(),
    )
    mem = next(
        ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")
    )
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "mem_gib": round(int(mem) / 2**20, 1),
        "kernel": platform.release(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="/usr/bin/python3.11")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "artifacts" / "wheelhouse" / "cp311")
    parser.add_argument("--lock", type=Path, default=LOCK_DIR / "py3.11-x86_64.txt")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    wheelhouse, lock = args.wheelhouse.resolve(), args.lock.resolve()
    work = Path(tempfile.mkdtemp(prefix="sglang-venv-bench-", dir=args.work))
    try:
        tools = work / "uv-venv"  # uv itself from its hashed pin, as the role installs it
        _run([args.python, "-m", "venv", str(tools)])
        _run([str(tools / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--require-hashes",
              "-r", str(ROOT / "files" / "locks" / "uv.txt")], clean_env())  # fmt: skip
        uv = str(tools / "bin" / "uv")
        offline = ["--no-index", "--find-links", str(wheelhouse), "-r", str(lock)]

        def pip(py: Path, cache: Path) -> list[str]:
            return [str(py), "-m", "pip", "install", "-q", "--no-deps", "--require-hashes",
                    "--cache-dir", str(cache), *offline]  # fmt: skip

        def uv_plain(py: Path, cache: Path) -> list[str]:
            return [uv, "pip", "install", "--python", str(py), "--no-deps", "--require-hashes",
                    "--cache-dir", str(cache), *offline]  # fmt: skip

        def uv_compiled(py: Path, cache: Path) -> list[str]:
            return [*uv_plain(py, cache), "--compile-bytecode"]

        runs = {}
        for name, argv_for in (("pip", pip), ("uv", uv_plain), ("uv --compile-bytecode", uv_compiled)):
            print(f"installing with {name} ...", flush=True)
            runs[name] = timed_install(name.split()[0] + ("-c" if "compile" in name else ""), args.python,
                                       argv_for, work, wheelhouse)  # fmt: skip
            print(f"  {runs[name]['seconds']} s", flush=True)
        pip_s = runs["pip"]["seconds"]
        result = {
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip(),
            "machine": machine(),
            "python": _run([args.python, "--version"]).strip(),
            "uv": _run([uv, "--version"]).strip(),
            "pip": _run([args.python, "-m", "pip", "--version"]).split(" from ")[0],
            "lock": str(lock.relative_to(ROOT)),
            "wheelhouse_wheels": len(list(wheelhouse.glob("*.whl"))),
            "wheelhouse_bytes": sum(p.stat().st_size for p in wheelhouse.glob("*.whl")),
            "runs": runs,
            "pip_over_uv": round(pip_s / runs["uv"]["seconds"], 2),
            "pip_over_uv_compiled": round(pip_s / runs["uv --compile-bytecode"]["seconds"], 2),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"sglang_venv_install-{result['date'][:10]}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
