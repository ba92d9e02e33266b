#!/usr/bin/python
"""Ansible module pd_hf_checkpoint: a Hub checkpoint on disk, every byte verified.

The logic lives in pd_appliance.checkpoint; this file parses arguments and reports.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_hf_checkpoint
short_description: Download a Hugging Face Hub checkpoint with huggingface_hub and verify every file
description:
  - Resolves I(revision) to its commit, lists the repository tree (size, git blob id and LFS sha256 of
    every file), verifies what I(dir) already holds against it, fetches what is missing or wrong
    (resumable partial files under C(.pd-appliance-partial/), renamed into place only once their hash
    matches), checks every safetensors header and the shard index, and records
    C(.pd-appliance-manifest.json).
  - A re-run with nothing changed verifies by stat (size, mtime, inode against the manifest) and
    reports C(changed=false). A file that still fails after one re-fetch fails the task naming the file
    and both hashes.
  - With I(offline) it never contacts I(endpoint); it verifies I(dir) against its manifest and fails on
    any mismatch.
  - Needs pd_appliance and huggingface-hub in the interpreter; run it with the tools venv
    (C(ansible_python_interpreter={{ appliance_tools_python }})).
options:
  repo_id:
    description: Repository on the Hub.
    type: str
    required: true
  revision:
    description: Commit hash to pin (a branch or tag is resolved and recorded).
    type: str
    required: true
  dir:
    description: Checkpoint directory (one revision, as given). One of I(dir) and I(root).
    type: path
  root:
    description:
      - Directory of revision directories (checkpoint_root); the revision goes to I(root)/<commit>, beside
        the others, a branch or tag is recorded in I(root)/refs/<name>, and files an earlier verified
        revision holds with the same sha256 are hard-linked from it and hashed again.
    type: path
  endpoint:
    description: Hub endpoint or a mirror of it (what HF_ENDPOINT would say).
    type: str
    default: https://huggingface.co
  offline:
    description: Verify only; never contact the endpoint.
    type: bool
    default: false
  token:
    description: Hub read token; never logged, never written to a file.
    type: str
  allow_patterns:
    description: Globs of files to download (all files when empty).
    type: list
    elements: str
    default: []
  ignore_patterns:
    description: Globs of files to skip.
    type: list
    elements: str
    default: []
  verify:
    description: C(auto) hashes only files whose stat changed since the manifest; C(full) hashes all.
    type: str
    choices: [auto, full]
    default: auto
  hash_workers:
    description: Files hashed at once (0 = one per core, at most 8).
    type: int
    default: 0
  download_workers:
    description: Files fetched at once.
    type: int
    default: 8
  xet_high_performance:
    description: Set HF_XET_HIGH_PERFORMANCE for the hf_xet transfer backend.
    type: bool
    default: true
  owner:
    description: Owner of the directory and its files.
    type: str
  group:
    description: Group of the directory and its files.
    type: str
"""

EXAMPLES = r"""
- name: Download and verify the checkpoint
  pd_hf_checkpoint:
    repo_id: nvidia/DeepSeek-V4-Flash-NVFP4
    revision: "{{ checkpoint_revision }}"
    root: "{{ checkpoint_root }}"
    token: "{{ checkpoint_hf_token | default(omit, true) }}"
    owner: "{{ appliance_user }}"
    group: "{{ appliance_group }}"
  vars:
    ansible_python_interpreter: "{{ appliance_tools_python }}"
"""

RETURN = r"""
revision:
  description: The commit verified.
  returned: always
  type: str
directory:
  description: The directory verified (I(root)/<commit> with I(root)).
  returned: always
  type: str
reused:
  description: Files hard-linked from an earlier verified revision (and hashed) instead of fetched.
  returned: always
  type: list
fetched:
  description: Files fetched by this run.
  returned: always
  type: list
verified_by_stat:
  description: Files trusted because their stat matches the manifest.
  returned: always
  type: int
hashed_files:
  description: Files whose bytes this run hashed.
  returned: always
  type: int
hash_mb_s:
  description: Hashing throughput of this run, MB/s.
  returned: always
  type: float
problems:
  description: On failure, each bad file with its expected and actual sha256.
  returned: failure
  type: list
"""

from pathlib import Path  # noqa: E402 - Ansible wants DOCUMENTATION first

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def main() -> None:
    """Parse arguments, set huggingface_hub's environment, ensure the checkpoint, exit."""
    module = AnsibleModule(
        argument_spec={
            "repo_id": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "dir": {"type": "path"},
            "root": {"type": "path"},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "offline": {"type": "bool", "default": False},
            "token": {"type": "str", "no_log": True},
            "allow_patterns": {"type": "list", "elements": "str", "default": []},
            "ignore_patterns": {"type": "list", "elements": "str", "default": []},
            "verify": {"type": "str", "choices": ["auto", "full"], "default": "auto"},
            "hash_workers": {"type": "int", "default": 0},
            "download_workers": {"type": "int", "default": 8},
            "xet_high_performance": {"type": "bool", "default": True},
            "owner": {"type": "str"},
            "group": {"type": "str"},
        },
        required_one_of=[("dir", "root")],
        mutually_exclusive=[("dir", "root")],
        supports_check_mode=True,
    )
    params = module.params
    root = Path(params["root"]) if params["root"] else None
    directory = Path(params["dir"]) if params["dir"] else root
    with tools_venv(
        module,
        "pd_appliance.checkpoint is not importable by {python} ({err}): run pd_hf_checkpoint"
        " with the tools venv (ansible_python_interpreter: appliance_tools_python), which the"
        " appliance_tools role installs.",
    ):
        from pd_appliance.checkpoint.ensure import PARTIAL_DIR
        from pd_appliance.checkpoint.hub import configure_hub_environment

        configure_hub_environment(
            cache_home=directory / PARTIAL_DIR / "hf-home",
            offline=params["offline"],
            xet_high_performance=params["xet_high_performance"],
        )
        from pd_appliance.checkpoint import (
            CheckpointError,
            CheckpointRequest,
            ensure_checkpoint,
            ensure_revision,
        )
    request = CheckpointRequest(
        repo_id=params["repo_id"],
        revision=params["revision"],
        directory=directory,
        endpoint=params["endpoint"],
        offline=params["offline"],
        token=params["token"] or None,
        allow_patterns=params["allow_patterns"] or None,
        ignore_patterns=params["ignore_patterns"] or None,
        verify=params["verify"],
        hash_workers=params["hash_workers"],
        download_workers=params["download_workers"],
        owner=params["owner"] or None,
        group=params["group"] or None,
        check_mode=module.check_mode,
        root=root,
    )
    try:
        report = ensure_revision(request) if root is not None else ensure_checkpoint(request)
    except CheckpointError as err:
        module.fail_json(msg=err.message, **err.details)
    result = report.as_dict()
    # exit_json's own "warnings" key is deprecated: warn through the module, return them by name.
    result["checkpoint_warnings"] = result.pop("warnings")
    for warning in report.warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
