"""Can the service user change code that root runs? Enumerate it, then try to write it as that user.

A worker is network-facing and runs `--trust-remote-code` as the service user; if that user can
write one file root later imports or executes (supervisord, its RPC extension, an interpreter a
root Ansible task uses, the unit or supervisor config that says what root starts), a compromised
worker becomes root at the next restart. Reading ownership and modes would miss ACLs, group
membership and parent directories that allow a rename; so this module *tries*, in a child that has
dropped to the service user's uid, gid and groups:

- a file: open it for appending (O_WRONLY|O_APPEND, nothing written, closed at once);
- a directory: create a new file in it (removed at once if that succeeded).

What root runs is read from the live host (run as root):
- the supervisor unit's main process and its root descendants: /proc/PID/exe, mapped files,
  existing paths on the command line (the interpreter and the script), the config named by `-c`
  and the files its [include] section pulls in;
- the unit file and its drop-ins (systemctl show);
- every interpreter given with --python (those root Ansible tasks use): everything on its sys.path;
- every parent directory of all of the above, up to /.

    python -m pd_appliance.privilege --unit pd-appliance-supervisor --user pd \\
        --python /opt/pd-appliance/tools/bin/python --python /usr/bin/python3

prints JSON {"tried": N, "files": F, "directories": D, "writable": [...], "roots": [...]} and exits
1 when anything was writable. Sticky world-writable directories (/tmp) are listed, not tried: adding
a file there replaces nothing of root's.
"""

from __future__ import annotations

import argparse
import configparser
import errno
import glob
import json
import os
import pwd
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SYS_PATH_SCRIPT = "import json, sys; print(json.dumps([p for p in sys.path if p]))"
# Kernel interfaces and devices are not code (a mapped /dev/zero or /dev/nvidia0 is not written as code).
NOT_CODE = ("/dev/", "/proc/", "/sys/")


@dataclass
class RootCode:
    """What root imports, executes or reads as instructions, and where each path came from."""

    files: set[str] = field(default_factory=set)
    directories: set[str] = field(default_factory=set)
    roots: list[str] = field(default_factory=list)

    def add_path(self, path: str) -> None:
        """Add a path and, for a symlink, what it points to (root follows it)."""
        for candidate in {path, os.path.realpath(path)}:
            if candidate.startswith(NOT_CODE):
                continue
            if os.path.isdir(candidate) and not os.path.islink(candidate):
                self.directories.add(candidate)
            elif os.path.exists(candidate):
                self.files.add(candidate)

    def add_tree(self, top: str) -> None:
        """Every file and directory under `top` (an interpreter's import path)."""
        if not os.path.isdir(top):
            self.add_path(top)
            return
        self.add_path(top)
        for directory, subdirs, names in os.walk(top):
            for name in subdirs:
                self.add_path(os.path.join(directory, name))
            for name in names:
                self.add_path(os.path.join(directory, name))

    def add_parents(self) -> None:
        """Every ancestor directory: write access to one allows replacing what it holds by rename."""
        for path in list(self.files | self.directories):
            parent = Path(path).parent
            while True:
                self.directories.add(str(parent))
                if parent == parent.parent:
                    break
                parent = parent.parent


def unit_main_pid(unit: str) -> tuple[int, list[str]]:
    """The unit's main pid and the unit file with its drop-ins."""
    out = subprocess.run(
        ["systemctl", "show", "--property=MainPID,FragmentPath,DropInPaths", unit],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    files = [props.get("FragmentPath", ""), *props.get("DropInPaths", "").split()]
    return int(props.get("MainPID") or 0), [f for f in files if f]


def root_descendants(pid: int) -> list[int]:
    """`pid` and every descendant of it running as uid 0 (a program supervisord starts as root)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            uid = os.stat(f"/proc/{current}").st_uid
        except OSError:
            continue
        if uid == 0:
            found.append(current)
        todo.extend(children.get(current, []))
    return found


def process_paths(pid: int) -> Iterator[str]:
    """The executable, mapped files and existing paths on the command line of one process."""
    yield os.readlink(f"/proc/{pid}/exe")
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/") and not parts[5].endswith("(deleted)"):
            yield parts[5]
    cwd = os.readlink(f"/proc/{pid}/cwd")
    for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
        text = arg.decode(errors="replace")
        if text and os.path.exists(os.path.join(cwd, text)):
            yield os.path.join(cwd, text)


def supervisor_configs(conf: str) -> list[str]:
    """supervisord.conf and the files its [include] section names (they say what root starts)."""
    parser = configparser.RawConfigParser(strict=False)
    parser.read(conf)
    found = [conf]
    if parser.has_option("include", "files"):
        base = os.path.dirname(conf)
        for pattern in parser.get("include", "files").split():
            found.extend(sorted(glob.glob(os.path.join(base, pattern))))
    return found


def interpreter_path(python: str) -> list[str]:
    """The directories an interpreter imports from (asked of the interpreter itself)."""
    out = subprocess.run([python, "-c", SYS_PATH_SCRIPT], capture_output=True, text=True, check=True).stdout
    return [p for p in json.loads(out) if os.path.exists(p)]


def config_arg(cmdline: list[str]) -> str | None:
    """The value of -c/--configuration on a supervisord command line."""
    for i, arg in enumerate(cmdline):
        if arg in ("-c", "--configuration") and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if arg.startswith("--configuration="):
            return arg.split("=", 1)[1]
    return None


def collect(unit: str | None, pythons: Iterable[str], extra: Iterable[str] = ()) -> RootCode:
    """Everything root runs on this host, read from the live processes and the given interpreters."""
    code = RootCode()
    if unit:
        main_pid, unit_files = unit_main_pid(unit)
        if not main_pid:
            raise SystemExit(
                f"unit {unit} has no main process: start it (systemctl start {unit}) and run again"
            )
        for path in unit_files:
            code.add_path(path)
        for pid in root_descendants(main_pid):
            cmdline = [
                a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ]
            code.roots.append(" ".join(a for a in cmdline if a))
            for path in process_paths(pid):
                code.add_path(path)
            conf = config_arg(cmdline)
            if conf:
                for path in supervisor_configs(conf):
                    code.add_path(path)
            for arg in cmdline:
                if os.path.basename(arg).startswith("python") and os.access(arg, os.X_OK):
                    for top in interpreter_path(arg):
                        code.add_tree(top)
    for python in pythons:
        if not os.path.exists(python):
            code.roots.append(f"interpreter {python} (absent: nothing to run)")
            continue
        code.roots.append(f"interpreter {python}")
        code.add_path(python)
        for top in interpreter_path(python):
            code.add_tree(top)
    for path in extra:
        code.add_tree(path)
    code.add_parents()
    return code


def writable_file(path: str) -> bool:
    """True when the current process may open `path` for writing (nothing is written)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ELOOP, errno.ETXTBSY, errno.EISDIR):
            return False
        if exc.errno in (errno.ENXIO, errno.ENOENT):
            return False
        raise
    os.close(fd)
    return True


def sticky_shared(path: str) -> bool:
    """A world-writable directory with the sticky bit (/tmp): anyone may add a file, but nobody may
    rename or remove another user's entry, so it cannot be used to replace root's code."""
    mode = os.stat(path).st_mode
    return bool(mode & stat.S_ISVTX) and bool(mode & stat.S_IWOTH)


def writable_directory(path: str) -> bool:
    """True when the current process may create a file in `path` (removed at once)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".pd-privilege-probe-", dir=path)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return False
        raise
    os.close(fd)
    os.unlink(name)
    return True


def probe_as(user: str, files: Iterable[str], directories: Iterable[str]) -> list[str]:
    """Try every write in a child that runs as `user`; return the paths it could write."""
    entry = pwd.getpwnam(user)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to the service user for good, then try
        os.close(read_end)
        status = 0
        try:
            os.setgroups(os.getgrouplist(user, entry.pw_gid))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            hits = [f for f in files if writable_file(f)] + [d for d in directories if writable_directory(d)]
            with os.fdopen(write_end, "wb") as out:
                out.write(json.dumps(hits).encode())
        except BaseException as exc:  # reported to the parent; the child must exit here, never return
            os.write(write_end, json.dumps({"error": repr(exc)}).encode()[:4096])
            status = 1
        os._exit(status)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    result = json.loads(b"".join(chunks) or b"null")
    if not isinstance(result, list):
        raise SystemExit(f"the probe as {user} failed: {result}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.privilege", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--user", required=True, help="the service user that must be refused")
    parser.add_argument("--unit", help="the systemd unit whose root processes to read")
    parser.add_argument(
        "--python", action="append", default=[], help="an interpreter root tasks use (repeat)"
    )
    parser.add_argument("--path", action="append", default=[], help="another tree root runs (repeat)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: reading root's processes and dropping to the service user need it")
    code = collect(args.unit, args.python, args.path)
    files = sorted(code.files)
    sticky = sorted(d for d in code.directories if sticky_shared(d))
    directories = sorted(code.directories - set(sticky))
    writable = probe_as(args.user, files, directories)
    report = {
        "user": args.user,
        "tried": len(files) + len(directories),
        "files": len(files),
        "directories": len(directories),
        "writable": writable,
        "sticky_directories_not_tried": sticky,
        "roots": code.roots,
        "sample": [p for p in directories if "pd-appliance" in p][:40],
    }
    print(json.dumps(report))
    return 1 if writable else 0


if __name__ == "__main__":
    sys.exit(main())
