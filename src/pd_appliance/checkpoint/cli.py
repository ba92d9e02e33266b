"""`pd-checkpoint`: verify (or download) a checkpoint by hand, with a progress bar.

    pd-checkpoint verify DIR [--quick] [--workers N] [--json]
    pd-checkpoint download --repo-id ID --revision REV --dir DIR [--endpoint URL] [--offline] ...

`verify` re-hashes every file against the directory's manifest (`--quick`: only files whose
stat changed) and checks every safetensors header and the index; it fetches and writes nothing.
`download` is what the checkpoint role runs; its token comes from the HF_TOKEN environment
variable, never from the command line (where `ps` would show it). Exit status: 0 verified,
1 verification failed or the source refused, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pd_appliance.checkpoint.ensure import (
    CheckpointReport,
    CheckpointRequest,
    ensure_checkpoint,
    verify_directory,
)
from pd_appliance.checkpoint.errors import CheckpointError


def _progress_factory(enabled: bool) -> Callable[[int, str], Callable[[int], None]] | None:
    """A tqdm bar per verification pass: bytes done, rate, ETA (tqdm ships with huggingface_hub)."""
    if not enabled:
        return None
    from tqdm import tqdm

    def make(total: int, description: str) -> Callable[[int], None]:
        bar = tqdm(
            total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=description, file=sys.stderr
        )
        done = [0]

        def advance(count: int) -> None:
            bar.update(count)
            done[0] += count
            if done[0] >= total:
                bar.close()

        return advance

    return make


def _summary(report: CheckpointReport, verb: str) -> str:
    rate = (
        f", hashed {report.hashed_bytes / 1e9:.2f} GB at {report.hash_mb_s:.0f} MB/s"
        if report.hashed_files
        else ""
    )
    lines = [
        f"{verb}: {report.repo_id}@{report.revision} in {report.directory}: {report.files} files,"
        f" {report.total_bytes / 1e9:.2f} GB ({report.hashed_files} hashed, {report.verified_by_stat} by"
        f" stat{rate})"
    ]
    if report.fetched:
        lines.append(f"fetched {len(report.fetched)}: {', '.join(report.fetched)}")
    lines.extend(f"warning: {w}" for w in report.warnings)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pd-checkpoint", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    verify = sub.add_parser("verify", help="verify DIR against its manifest; fetches nothing")
    verify.add_argument("directory", type=Path)
    verify.add_argument("--quick", action="store_true", help="hash only files whose size/mtime/inode changed")
    verify.add_argument(
        "--workers", type=int, default=0, help="files hashed at once (default: one per core, max 8)"
    )
    verify.add_argument("--json", action="store_true", help="print the report as JSON, no progress bar")

    download = sub.add_parser("download", help="download and verify (token from $HF_TOKEN)")
    download.add_argument("--repo-id", required=True)
    download.add_argument("--revision", required=True, help="a commit hash (or a branch, which is resolved)")
    download.add_argument("--dir", required=True, type=Path, dest="directory")
    download.add_argument("--endpoint", default=os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    download.add_argument("--offline", action="store_true", help="verify only, never contact the endpoint")
    download.add_argument(
        "--allow", action="append", default=None, help="glob of files to include (repeatable)"
    )
    download.add_argument(
        "--ignore", action="append", default=None, help="glob of files to skip (repeatable)"
    )
    download.add_argument("--full", action="store_true", help="re-hash every file, even unchanged ones")
    download.add_argument("--workers", type=int, default=0)
    download.add_argument("--json", action="store_true")

    args = parser.parse_args(argv)
    progress = _progress_factory(not args.json)
    try:
        if args.command == "verify":
            if not args.directory.is_dir():
                parser.error(f"{args.directory} is not a directory")
            report = verify_directory(
                args.directory, full=not args.quick, workers=args.workers, progress=progress
            )
            verb = "verified"
        else:
            request = CheckpointRequest(
                repo_id=args.repo_id,
                revision=args.revision,
                directory=args.directory,
                endpoint=args.endpoint,
                offline=args.offline,
                token=os.environ.get("HF_TOKEN") or None,
                allow_patterns=args.allow,
                ignore_patterns=args.ignore,
                verify="full" if args.full else "auto",
                hash_workers=args.workers,
            )
            report = ensure_checkpoint(request, progress=progress)
            verb = "downloaded and verified" if report.fetched else "verified"
    except CheckpointError as err:
        if args.json:
            print(json.dumps({"ok": False, "error": err.message, **err.details}, indent=2))
        else:
            print(f"FAILED: {err.message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"ok": True, **report.as_dict()}, indent=2))
    else:
        print(_summary(report, verb))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
