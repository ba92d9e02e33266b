"""Checkpoint verification throughput: pd_appliance's parallel hashing vs single-threaded hashlib.

Writes a multi-GB file set shaped like checkpoint shards into a temporary folder (default under
/tmp, removed afterwards) and times, in the same run:

- baseline: one thread, `hashlib.file_digest(f, "sha256")` file after file (the stdlib way);
- pd_appliance: `pd_appliance.checkpoint.hashing.hash_files` (several files at once, 16 MiB reads);
- read-only: the same parallel reads without hashing, i.e. what the disk alone delivers.

Each is measured cold (pages dropped with posix_fadvise(DONTNEED) after an fsync, so the bytes
come from the disk) and warm (page cache), and pd_appliance across worker counts. Results go to
benchmarks/results/checkpoint_verify.md with the date, machine and commit.

    python benchmarks/checkpoint_verify.py [--files 6] [--size-mib 768] [--dir /tmp] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pd_appliance.checkpoint.hashing import DEFAULT_CHUNK_BYTES, HashJob, default_workers, hash_files


def write_file_set(folder: Path, files: int, size_mib: int) -> list[Path]:
    block = os.urandom(64 << 20)
    paths = []
    for number in range(files):
        path = folder / f"model-{number + 1:05d}-of-{files:05d}.safetensors"
        with path.open("wb") as handle:
            remaining = size_mib << 20
            while remaining:
                piece = block[: min(len(block), remaining)]
                handle.write(number.to_bytes(8, "little") + piece[8:])
                remaining -= len(piece)
            handle.flush()
            os.fsync(handle.fileno())
        paths.append(path)
    return paths


def drop_cache(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(paths: list[Path]) -> None:
    for path in paths:
        with path.open("rb") as handle:
            while handle.read(DEFAULT_CHUNK_BYTES):
                pass


def baseline(paths: list[Path]) -> dict[str, str]:
    out = {}
    for path in paths:
        with path.open("rb") as handle:
            out[path.name] = hashlib.file_digest(handle, "sha256").hexdigest()
    return out


def ours(paths: list[Path], workers: int) -> dict[str, str]:
    digests = hash_files([HashJob(p.name, p) for p in paths], workers=workers)
    return {name: d.sha256 for name, d in digests.items()}  # type: ignore[union-attr]


def read_only(paths: list[Path], workers: int) -> None:
    def read(path: Path) -> None:
        buffer = bytearray(DEFAULT_CHUNK_BYTES)
        with path.open("rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(read, paths))


def timed(
    label: str, func, paths: list[Path], total: int, cold: bool, repeats: int
) -> tuple[str, float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        (drop_cache if cold else warm_cache)(paths)
        started = time.perf_counter()
        result = func(paths)
        best = min(best, time.perf_counter() - started)
    rate = total / 1e6 / best
    print(f"{label:48s} {'cold' if cold else 'warm'}  {best:7.2f} s  {rate:8.0f} MB/s", flush=True)
    return label, rate, result


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--size-mib", type=int, default=768)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "checkpoint_verify.md"))
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="pd-checkpoint-bench-", dir=args.dir))
    try:
        started = time.perf_counter()
        paths = write_file_set(folder, args.files, args.size_mib)
        total = sum(p.stat().st_size for p in paths)
        print(
            f"wrote {len(paths)} x {args.size_mib} MiB = {total / 1e9:.2f} GB in"
            f" {time.perf_counter() - started:.1f} s"
        )
        workers = default_workers()
        rows = []
        for cold in (True, False):
            label, base_rate, base = timed(
                "baseline: hashlib.file_digest, 1 thread", baseline, paths, total, cold, args.repeats
            )
            rows.append((label, cold, base_rate, 1.0))
            for count in sorted({1, 2, workers, 4, 8}):
                name = f"pd_appliance hash_files, {count} worker(s)"
                label, rate, got = timed(
                    name, lambda p, c=count: ours(p, c), paths, total, cold, args.repeats
                )
                assert got == base, "parallel hashing disagrees with hashlib"
                rows.append((label, cold, rate, rate / base_rate))
            name = f"read only (no hash), {workers} worker(s)"
            label, rate, _ = timed(name, lambda p: read_only(p, workers), paths, total, cold, args.repeats)
            rows.append((label, cold, rate, rate / base_rate))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    load = os.getloadavg()
    lines = [
        "# Checkpoint verification throughput",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()} (no GPU involved: hashing is CPU and disk work)",
        f"- commit: {commit.stdout.strip() or 'unknown'}",
        f"- file set: {len(paths)} files x {args.size_mib} MiB = {total / 1e9:.2f} GB under {args.dir},"
        " removed afterwards",
        f"- load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
        " (other jobs shared this machine; best of"
        f" {args.repeats} repeats)",
        "- cold = pages dropped with posix_fadvise(DONTNEED) before each pass; warm = page cache",
        f"- command: `python benchmarks/checkpoint_verify.py --files {args.files} --size-mib"
        f" {args.size_mib}`",
        "",
        "| what | cache | MB/s | vs baseline |",
        "| --- | --- | ---: | ---: |",
    ]
    lines += [
        f"| {label} | {'cold' if cold else 'warm'} | {rate:.0f} | {ratio:.2f}x |"
        for label, cold, rate, ratio in rows
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
