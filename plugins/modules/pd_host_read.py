#!/usr/bin/python
"""Ansible module pd_host_read: a role's reads of the host (commands, files, stats) in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_host_read
short_description: Run read-only commands, read files and stat paths on the host, in one module run
description:
  - What M(ansible.builtin.command) (a read-only probe), M(ansible.builtin.slurp) and
    M(ansible.builtin.stat) return, for many of them in one module run. Every module run costs about
    0.4 s of the host's CPU whatever it does (AnsiballZ imports ansible.module_utils from a zip, without
    bytecode), and a re-run of a converged host is mostly such reads (docs/molecule.md, "No-op
    re-run").
  - Changes nothing, so it runs in check mode too. A command that fails is a result (its C(rc)), not a
    failure of the task; the role judges it, as it judged a command task that never failed.
  - Runs under any Python the host has (only ansible.module_utils), like the builtin modules.
options:
  commands:
    description: Read-only commands by name, each an argv list (no shell).
    type: dict
    default: {}
  files:
    description: Files to read by name (small text files, such as pidfiles, manifests and records).
    type: dict
    default: {}
  stats:
    description: Paths to stat by name.
    type: dict
    default: {}
  sha256:
    description: Files to hash by name (a copy skipped when the host holds the same bytes).
    type: dict
    default: {}
  directories:
    description: Directories to list by name (the names of the regular files in each, sorted).
    type: dict
    default: {}
author: pd-appliance
"""

EXAMPLES = r"""
- name: Read the listeners, the processes and supervisord's pidfile
  pd_host_read:
    commands:
      listeners: [ss, -Htlnp]
      processes: [ps, -eo, "pid=,ppid=,args="]
    files:
      pidfile: /run/pd-appliance/supervisord.pid
    stats:
      venv: /opt/pd-appliance/tools/bin/python
  register: host_reads
"""

RETURN = r"""
commands:
  description: "Per name, C({rc, stdout, stderr, stdout_lines}) as M(ansible.builtin.command) returns them."
  type: dict
  returned: always
files:
  description: >-
    Per name, M(ansible.builtin.slurp)'s shape (C(content) base64, C(encoding), C(source)) for a file
    that exists; C({source}) alone (no C(content)) for one that does not, or cannot be read.
  type: dict
  returned: always
stats:
  description: >-
    Per name, C({stat: {...}}) as M(ansible.builtin.stat) returns it: C(exists) and, for an existing
    path, C(path), C(isdir), C(isreg), C(islnk), C(executable), C(readable), C(size), C(mtime), C(mode),
    C(uid), C(gid), C(pw_name), C(gr_name) (ownership and type of what a link points to).
  type: dict
  returned: always
sha256:
  description: Per name, the file's sha256 (hex), or null when it does not exist or cannot be read.
  type: dict
  returned: always
directories:
  description: Per name, the sorted names of the directory's regular files, or null when it cannot be listed.
  type: dict
  returned: always
"""

import base64  # noqa: E402  (Ansible wants DOCUMENTATION first)
import grp  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _run(module: AnsibleModule, argv: list) -> dict:
    """One read-only command: a missing program is rc 127 with the reason, as a shell would say it."""
    if not isinstance(argv, list) or not argv:
        module.fail_json(msg=f"each command is a non-empty argv list, got {argv!r}")
    try:
        rc, out, err = module.run_command(
            [str(arg) for arg in argv], check_rc=False, expand_user_and_vars=False, handle_exceptions=False
        )
    except OSError as exc:
        rc, out, err = 127, "", str(exc)
    stdout, stderr = out.rstrip("\n"), err.rstrip("\n")
    return {"rc": rc, "stdout": stdout, "stderr": stderr, "stdout_lines": stdout.splitlines()}


def _read(path: str) -> dict:
    """The file's bytes in slurp's shape; without C(content) when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return {"source": path}
    return {"content": base64.b64encode(data).decode("ascii"), "encoding": "base64", "source": path}


def _sha256(path: str) -> str | None:
    """The file's sha256, read in blocks (a wheel is megabytes)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _list(path: str) -> list | None:
    """The regular files of a directory (links followed), sorted; None when it cannot be listed."""
    try:
        return sorted(entry.name for entry in os.scandir(path) if entry.is_file())
    except OSError:
        return None


def _name(lookup, ident: int) -> str | None:
    """A user or group name, or None for an id with no entry (as stat returns it)."""
    try:
        return lookup(ident)[0]
    except KeyError:
        return None


def _stat(path: str) -> dict:
    """stat's fields the roles read; a dangling link is a link that exists."""
    try:
        link = os.lstat(path)
    except OSError:
        return {"stat": {"exists": False}}
    try:
        info = os.stat(path)
    except OSError:
        info = link
    return {
        "stat": {
            "exists": True,
            "path": path,
            "isdir": stat.S_ISDIR(info.st_mode),
            "isreg": stat.S_ISREG(info.st_mode),
            "islnk": stat.S_ISLNK(link.st_mode),
            "executable": os.access(path, os.X_OK),
            "readable": os.access(path, os.R_OK),
            "size": info.st_size,
            "mtime": info.st_mtime,
            "mode": f"{stat.S_IMODE(info.st_mode):04o}",
            "uid": info.st_uid,
            "gid": info.st_gid,
            "pw_name": _name(pwd.getpwuid, info.st_uid),
            "gr_name": _name(grp.getgrgid, info.st_gid),
        }
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "commands": {"type": "dict", "default": {}},
            "files": {"type": "dict", "default": {}},
            "stats": {"type": "dict", "default": {}},
            "sha256": {"type": "dict", "default": {}},
            "directories": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    module.exit_json(
        changed=False,
        commands={name: _run(module, argv) for name, argv in params["commands"].items()},
        files={name: _read(str(path)) for name, path in params["files"].items()},
        stats={name: _stat(str(path)) for name, path in params["stats"].items()},
        sha256={name: _sha256(str(path)) for name, path in params["sha256"].items()},
        directories={name: _list(str(path)) for name, path in params["directories"].items()},
    )


if __name__ == "__main__":
    main()
