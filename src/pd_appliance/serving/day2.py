"""Day-2 operations: status, diagnostics bundles and kernel profiles.

    python -m pd_appliance.serving.day2 status --serverurl URL --health NAME=URL ...
    python -m pd_appliance.serving.day2 diagnostics --out F.tar.gz --path DIR ... [--pip-python PY]
    python -m pd_appliance.serving.day2 load --url ROUTER --requests 8 --concurrency 4 [--api-key-env V]
    python -m pd_appliance.serving.day2 top-kernels --dir PROFILE_DIR [--since TS] [--top 15]

Each prints one JSON object for the day-2 playbooks.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REDACTED = "<redacted>"
# Flags whose value is a secret, and env-file / environment names that hold one.
_SECRET_FLAG = re.compile(r"(--(?:api-key|hf-token|token|password)[= ]+)(\S+)")
_SECRET_NAME = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD)", re.IGNORECASE)
_SECRET_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_ENV_PAIR = re.compile(r"""([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|'[^']*')""")


# ---- status --------------------------------------------------------------------------------
def parent_map(proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> ppid for every visible process."""
    parents = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def owner_program(pid: int, program_pids: Mapping[str, int], parents: Mapping[int, int]) -> str | None:
    """The supervisor program whose process tree contains pid (SGLang's TP ranks are children)."""
    by_pid = {p: name for name, p in program_pids.items() if p}
    seen = set()
    while pid and pid not in seen:
        if pid in by_pid:
            return by_pid[pid]
        seen.add(pid)
        pid = parents.get(pid, 0)
    return None


def gpu_memory_by_program(
    apps: Iterable[tuple[int, int, str]], program_pids: Mapping[str, int], parents: Mapping[int, int]
) -> dict[str, dict[str, Any]]:
    """Sum nvidia-smi compute-app memory (pid, MiB, gpu uuid) per supervisor program."""
    result: dict[str, dict[str, Any]] = {}
    for pid, mib, gpu in apps:
        name = owner_program(pid, program_pids, parents) or "other"
        entry = result.setdefault(name, {"memory_mib": 0, "gpus": [], "pids": []})
        entry["memory_mib"] += mib
        if gpu not in entry["gpus"]:
            entry["gpus"].append(gpu)
        entry["pids"].append(pid)
    return result


def nvidia_smi_apps(binary: str = "nvidia-smi") -> list[tuple[int, int, str]] | None:
    """(pid, used MiB, gpu uuid) per compute process, or None when nvidia-smi is not there."""
    if not shutil.which(binary):
        return None
    out = subprocess.run(
        [binary, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    apps = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            apps.append((int(parts[0]), int(parts[1]) if parts[1].isdigit() else 0, parts[2]))
    return apps


def probe(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        return {"url": url, "ok": False, "error": str(getattr(exc, "reason", exc))}
    return {
        "url": url,
        "ok": 200 <= status < 300,
        "status": status,
        "ms": round((time.monotonic() - started) * 1000),
    }


def status(serverurl: str, health: Mapping[str, str]) -> dict[str, Any]:
    from pd_appliance.serving.apply import connect

    infos = [i for i in connect(serverurl).supervisor.getAllProcessInfo() if i["group"] == "pd"]
    programs = {
        i["name"]: {
            "state": i["statename"],
            "pid": i["pid"],
            "uptime_s": max(0, i["now"] - i["start"]) if i["pid"] else 0,
            "description": i["description"],
        }
        for i in infos
    }
    for name, url in health.items():
        programs.setdefault(name, {"state": "ABSENT"})["health"] = probe(url)
    apps = nvidia_smi_apps()
    gpu = None
    if apps is not None:
        gpu = gpu_memory_by_program(apps, {n: p.get("pid", 0) for n, p in programs.items()}, parent_map())
    healthy = all(
        p.get("state") == "RUNNING" and p.get("health", {"ok": True})["ok"] for p in programs.values()
    )
    return {"healthy": healthy, "programs": programs, "gpu_memory": gpu, "nvidia_smi": apps is not None}


# ---- diagnostics ---------------------------------------------------------------------------
def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Remove secrets from a config, env file or log: known values, secret flags, secret-named vars."""
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _SECRET_FLAG.sub(lambda m: m.group(1) + REDACTED, text)
    text = _ENV_PAIR.sub(_redact_env_pair, text)
    lines = []
    for line in text.splitlines(keepends=True):
        match = _SECRET_ASSIGN.match(line.rstrip("\n"))
        if match and _SECRET_NAME.search(match.group(1)):
            line = f"{match.group(1)}={REDACTED}\n"
        lines.append(line)
    return "".join(lines)


def _redact_env_pair(match: re.Match[str]) -> str:
    name, quoted = match.group(1), match.group(2)
    return f"{name}={quoted[0]}{REDACTED}{quoted[0]}" if _SECRET_NAME.search(name) else match.group(0)


def _env_file_secrets(paths: Iterable[Path]) -> list[str]:
    values = []
    for path in paths:
        if path.suffix == ".env" and path.is_file():
            with_values = (
                _SECRET_ASSIGN.match(line) for line in path.read_text(errors="replace").splitlines()
            )
            values += [m.group(2) for m in with_values if m and m.group(2)]
    return values


def _files(paths: Iterable[str], max_bytes: int, exclude: Path | None = None) -> Iterable[tuple[Path, Path]]:
    """(file, name in the bundle) for `LABEL=PATH` or `PATH` entries; skips `exclude` and big files."""
    for raw in paths:
        label, sep, where = raw.partition("=")
        base = Path(where if sep else raw)
        label = label if sep else base.name
        if base.is_file():
            yield base, Path(label)
        elif base.is_dir():
            for path in sorted(base.rglob("*")):
                if exclude is not None and exclude in path.parents:
                    continue
                if path.is_file() and not path.is_symlink() and path.stat().st_size <= max_bytes:
                    yield path, Path(label) / path.relative_to(base)


def diagnostics(
    out: str,
    paths: Sequence[str],
    extra: Mapping[str, str],
    pip_python: str | None,
    max_bytes: int = 64 << 20,
) -> dict[str, Any]:
    """A tar.gz of configs, logs and state with every secret removed, plus extra named texts."""
    sources = list(_files(paths, max_bytes, exclude=Path(out).resolve().parent))
    secrets = _env_file_secrets(path for path, _ in sources)
    texts = dict(extra)
    if pip_python:
        if Path(pip_python).exists():
            freeze = subprocess.run([pip_python, "-m", "pip", "freeze"], capture_output=True, text=True,
                                    timeout=120, check=False)  # fmt: skip
            texts["pip-freeze-sglang.txt"] = freeze.stdout + freeze.stderr
        else:
            texts["pip-freeze-sglang.txt"] = f"{pip_python} does not exist on this host\n"
    members = []
    with tarfile.open(out, "w:gz") as tar:
        for path, name in sources:
            data = redact_text(path.read_text(errors="replace"), secrets).encode()
            _add(tar, f"diagnostics/{name}", data)
            members.append(str(name))
        for text_name, text in texts.items():
            _add(tar, f"diagnostics/{text_name}", redact_text(text, secrets).encode())
            members.append(text_name)
    os.chmod(out, 0o600)
    return {"changed": True, "path": out, "files": members, "redacted_values": len(set(secrets))}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
    tar.addfile(info, io.BytesIO(data))


# ---- profile -------------------------------------------------------------------------------
def _one_request(url: str, model: str, max_tokens: int, api_key: str | None, index: int) -> dict[str, Any]:
    prompt = f"Profile request {index}: tell a long story."
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url.rstrip("/") + "/v1/completions", json.dumps(body).encode(), headers)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            usage = json.loads(response.read()).get("usage", {})
        return {"ok": True, "s": time.monotonic() - started, "tokens": usage.get("completion_tokens", 0)}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"ok": False, "error": str(exc)}


def load(
    url: str, model: str, requests: int, concurrency: int, max_tokens: int, api_key: str | None
) -> dict[str, Any]:
    """A short closed-loop load so the profiler records decode steps."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: _one_request(url, model, max_tokens, api_key, i), range(requests)))
    wall = time.monotonic() - started
    tokens = sum(r.get("tokens", 0) for r in results)
    errors = [r["error"] for r in results if not r["ok"]]
    return {"requests": requests, "failed": len(errors), "errors": errors[:3], "output_tokens": tokens,
            "wall_s": round(wall, 2), "output_tok_s": round(tokens / wall, 1) if wall else 0.0}  # fmt: skip


def read_trace(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    return data if isinstance(data, dict) else {"traceEvents": data}


def top_kernels(traces: Iterable[Path], top: int = 15) -> dict[str, Any]:
    """GPU kernels by total time across torch-profiler traces (chrome format, 'kernel' events).
    `stand_in` lists what wrote traces in an engine's place, in its own words (a trace's `stand_in`
    key: the rehearsal engine's say so), so the report never passes them off as GPU measurements."""
    totals: dict[str, list[float]] = {}
    stand_ins: set[str] = set()
    files = []
    for path in traces:
        data = read_trace(path)
        if data.get("stand_in"):
            stand_ins.add(str(data["stand_in"]))
        files.append(str(path))
        for event in data.get("traceEvents", []):
            if event.get("ph") == "X" and str(event.get("cat", "")).lower() in ("kernel", "gpu_kernel"):
                entry = totals.setdefault(str(event.get("name")), [0.0, 0])
                entry[0] += float(event.get("dur", 0.0))
                entry[1] += 1
    total_us = sum(v[0] for v in totals.values())
    ranked = sorted(totals.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    rows = [
        {"kernel": name, "total_ms": round(us / 1000, 3), "calls": int(calls),
         "share": round(us / total_us, 4) if total_us else 0.0}
        for name, (us, calls) in ranked
    ]  # fmt: skip
    return {"traces": files, "kernel_time_ms": round(total_us / 1000, 3), "top": rows,
            "stand_in": sorted(stand_ins)}  # fmt: skip


def find_traces(directory: str, since: float = 0.0) -> list[Path]:
    base = Path(directory)
    if not base.is_dir():
        return []
    found = [p for p in base.rglob("*") if p.is_file() and (p.name.endswith((".json", ".json.gz")))]
    return sorted(p for p in found if p.stat().st_mtime >= since)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pd_appliance.serving.day2", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("status")
    s.add_argument("--serverurl", required=True)
    s.add_argument("--health", action="append", default=[], metavar="NAME=URL")
    d = sub.add_parser("diagnostics")
    d.add_argument("--out", required=True)
    d.add_argument("--path", action="append", default=[])
    d.add_argument("--text", action="append", default=[], metavar="NAME=FILE", help="add FILE's text as NAME")
    d.add_argument("--pip-python", default=None)
    ld = sub.add_parser("load")
    ld.add_argument("--url", required=True)
    ld.add_argument("--model", required=True)
    ld.add_argument("--requests", type=int, default=8)
    ld.add_argument("--concurrency", type=int, default=4)
    ld.add_argument("--max-tokens", type=int, default=64)
    ld.add_argument("--api-key-env", default=None, help="environment variable holding the router API key")
    ld.add_argument(
        "--api-key-stdin", action="store_true",
        help="read the router API key from stdin (Ansible's `environment:` would put it on a command line)",
    )  # fmt: skip
    k = sub.add_parser("top-kernels")
    k.add_argument("--dir", required=True)
    k.add_argument("--since", type=float, default=0.0)
    k.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    if args.command == "status":
        health = dict(h.split("=", 1) for h in args.health)
        result = status(args.serverurl, health)
    elif args.command == "diagnostics":
        extra = {}
        for spec in args.text:
            name, _, path = spec.partition("=")
            extra[name] = (
                Path(path).read_text(errors="replace") if Path(path).is_file() else f"{path} missing\n"
            )
        result = diagnostics(args.out, args.path, extra, args.pip_python)
    elif args.command == "load":
        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        if args.api_key_stdin:
            key = sys.stdin.readline().strip() or None
        result = load(args.url, args.model, args.requests, args.concurrency, args.max_tokens, key)
    else:
        traces = find_traces(args.dir, args.since)
        if not traces:
            print(
                json.dumps(
                    {"failed": True, "msg": f"no profiler trace under {args.dir} newer than {args.since}"}
                )
            )
            return 1
        result = top_kernels(traces, args.top)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
