#!/usr/bin/python
"""Ansible module pd_config_files: a role's directories and rendered files in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_config_files
short_description: Ensure a set of directories and files (content given) with their owner, group and mode
description:
  - What M(ansible.builtin.file) (state=directory) and M(ansible.builtin.copy) (content=) do for one path,
    done for many in one module run. A copy or template whose content did not change still costs two
    module runs (a stat, then file for the attributes), each about 0.4 s of the host's CPU; a role that
    writes a dozen small files pays that on every converge (docs/molecule.md, "Per-task overhead").
  - Files are compared by content and written atomically (a temporary file in the same directory, given
    its owner, group and mode first, then renamed over the old one); owner, group and mode are set on
    every path, changed or not.
  - A missing directory is created with its parents; each directory it creates gets the entry's
    owner, group and mode, as M(ansible.builtin.file) does.
  - Templates are rendered on the controller (the template lookup) and passed as I(content); give the
    task C(no_log) when a content holds secrets (the diff would show it).
  - Runs under any Python the host has (only ansible.module_utils), like the builtin modules.
options:
  directories:
    description: Directories to exist, each C({path, owner, group, mode}); created in the order given.
    type: list
    elements: dict
    default: []
  files:
    description: >-
      Files to hold exactly I(content), each C({path, content, owner, group, mode, name, validate}); C(name)
      is what C(changed_names) reports for it (default: the path). The file's directory must exist (list it in
      I(directories)). C(validate), as M(ansible.builtin.template)'s: a command (no shell) with C(%s), run on
      the new content (a temporary file beside the path) before it replaces the old file; when it exits
      non-zero the old file stays and the task fails with its output.
    type: list
    elements: dict
    default: []
  absent:
    description: Paths to remove (files, or links); a missing one is no change.
    type: list
    elements: path
    default: []
"""

RETURN = r"""
changed_names:
  description: The C(name) of every file whose content or attributes changed, in the order given.
  type: list
  returned: always
changed_paths:
  description: Every path (directory, file, removed path) that changed.
  type: list
  returned: always
"""

import os  # noqa: E402  (Ansible wants DOCUMENTATION first)
import shlex  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

ATTRIBUTES = ("owner", "group", "mode")


def _file_args(entry: dict, path: str) -> dict:
    """The arguments set_fs_attributes_if_different reads, for one path."""
    args = {key: entry.get(key) for key in ATTRIBUTES}
    args.update(path=path, seuser=None, serole=None, setype=None, selevel=None, secontext=[None, None, None])
    args["attributes"] = None
    return args


def _ensure_directory(module: AnsibleModule, entry: dict, diffs: list) -> bool:
    """Create the directory (and its missing parents, each with the entry's attributes); set them."""
    path = os.path.abspath(entry["path"])
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    if os.path.lexists(path) and not os.path.isdir(path):
        module.fail_json(msg=f"{path} exists and is not a directory", path=path)
    changed = bool(missing)
    if missing:
        diffs.append({"before_header": path, "after_header": path, "before": {"state": "absent"},
                      "after": {"state": "directory"}})  # fmt: skip
    if missing and not module.check_mode:
        for created in reversed(missing):
            os.mkdir(created)
            module.set_fs_attributes_if_different(_file_args(entry, created), False, expand=False)
    if not missing:
        diff: dict = {"before": {}, "after": {}}
        changed = module.set_fs_attributes_if_different(_file_args(entry, path), False, diff, expand=False)
        if changed:
            diffs.append({"before_header": path, "after_header": path, **diff})
    return changed


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _validate(module: AnsibleModule, entry: dict, temporary: str) -> None:
    """Run the entry's validate command on the new content; fail (old file kept) when it refuses it."""
    command = entry.get("validate")
    if not command:
        return
    if "%s" not in command:
        module.fail_json(msg=f"validate for {entry['path']} must contain %s: {command}")
    rc, out, err = module.run_command([part.replace("%s", temporary) for part in shlex.split(command)])
    if rc != 0:
        module.fail_json(
            msg=f"{entry['path']} was not changed: `{command}` refused the new content (rc {rc})",
            stdout=out, stderr=err, path=entry["path"],
        )  # fmt: skip


def _ensure_file(module: AnsibleModule, entry: dict, diffs: list) -> bool:
    """Write the content when it differs (atomically); set owner, group and mode."""
    path = os.path.abspath(entry["path"])
    wanted = entry["content"].encode("utf-8")
    current = _read(path)
    changed = current != wanted
    if changed:
        before = "" if current is None else current.decode("utf-8", errors="replace")
        diffs.append(
            {"before_header": path, "after_header": path, "before": before, "after": entry["content"]}
        )
        if not module.check_mode:
            directory = os.path.dirname(path)
            if not os.path.isdir(directory):
                module.fail_json(msg=f"{directory} does not exist: list it in directories", path=path)
            # Owner and mode go on the temporary file (mkstemp: 0600) before the rename, so a secret is
            # never readable by anyone else, not even for a moment.
            handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(wanted)
                module.set_fs_attributes_if_different(_file_args(entry, temporary), False, expand=False)
                _validate(module, entry, temporary)
                os.replace(temporary, path)
            finally:
                if os.path.lexists(temporary):
                    os.unlink(temporary)
    if os.path.lexists(path):
        diff: dict = {"before": {}, "after": {}}
        if module.set_fs_attributes_if_different(_file_args(entry, path), False, diff, expand=False):
            changed = True
            diffs.append({"before_header": path, "after_header": path, **diff})
    return changed


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "absent": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    for kind, required in (("directories", ("path",)), ("files", ("path", "content"))):
        for index, entry in enumerate(module.params[kind]):
            lacking = [key for key in required if entry.get(key) is None]
            if lacking:
                module.fail_json(msg=f"{kind}[{index}] has no {', '.join(lacking)}")
    diffs: list = []
    changed_paths: list = []
    changed_names: list = []
    for entry in module.params["directories"]:
        if _ensure_directory(module, entry, diffs):
            changed_paths.append(entry["path"])
    for entry in module.params["files"]:
        if _ensure_file(module, entry, diffs):
            changed_paths.append(entry["path"])
            changed_names.append(entry.get("name") or entry["path"])
    for path in module.params["absent"]:
        if os.path.lexists(path) and not os.path.isdir(path):
            diffs.append({"before_header": path, "after_header": path, "before": {"state": "file"},
                          "after": {"state": "absent"}})  # fmt: skip
            if not module.check_mode:
                os.unlink(path)
            changed_paths.append(path)
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths, changed_names=changed_names,
                     diff=diffs)  # fmt: skip


if __name__ == "__main__":
    main()
