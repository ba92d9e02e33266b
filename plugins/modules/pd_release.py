#!/usr/bin/python
"""Ansible module pd_release: a host's releases (logic in pd_appliance.release)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_release
short_description: Record, accept, fail, roll back and prune the releases a host serves
description:
  - A release is the SGLang build (version, patch series, locks; its venv), NIXL, the checkpoint
    revision (its directory and manifest digest), the tuning variant in force and the rendered supervisor
    section of every pd program. Records, the current release, accepted and failed ones and the history
    live in I(state_dir) (pd_appliance.release.store).
  - C(stage) records the release of the sections the serving role just rendered and makes it current. It
    refuses, and writes the running release's sections back, when the release would switch to a venv that
    is not installed, a revision that is not verified, or a release that failed its gates (unless
    I(retry_failed)).
  - C(accept) marks the current release accepted and prunes, keeping I(keep) accepted releases, the checkpoint
    revisions of the I(keep_revisions) newest, fewer while the model filesystem has less than
    I(min_free_bytes) free; venvs and revision directories no kept release uses are removed.
  - C(fail) records why the current release failed. C(put_back) writes the sections of the release to roll
    back to (I(to), else the newest accepted one still installed) into I(conf_dir); C(activate) makes it
    current once its programs run. C(status) reads the state.
  - Needs pd_appliance in the interpreter: run it with the tools venv.
options:
  action:
    description: What to do.
    type: str
    required: true
    choices: [stage, accept, fail, put_back, activate, status]
  state_dir:
    description: The host's release state (release_state_dir).
    type: path
    required: true
  conf_dir:
    description: The supervisor conf.d of the pd program sections (stage; put_back reads it from the state).
    type: path
  programs:
    description: "stage: this host's pd programs, name -> {role, health_url}."
    type: dict
    default: {}
  sglang_venv:
    description: "stage: the release's SGLang venv (appliance_sglang_venv)."
    type: path
  sglang_version:
    description: "stage: the SGLang version the venv must hold."
    type: str
  sglang_series:
    description: "stage: the patch series the venv must carry, [{name, sha256}] in order."
    type: list
    elements: dict
    default: []
  model_dir:
    description: "stage: the checkpoint revision directory (appliance_model_dir)."
    type: path
  repo_id:
    description: "stage: the checkpoint's repository (checkpoint_repo_id)."
    type: str
  variant:
    description: "stage: the tuning variant in force ({name, vars, env_hooks}; {} for none)."
    type: dict
    default: {}
  workers:
    description: "stage: the host runs prefill or decode (false: the router only, no venv or checkpoint)."
    type: bool
    default: true
  supervisor:
    description: "stage: where the programs run ({serverurl, conf_dir, group}), kept for a later rollback."
    type: dict
    default: {}
  caches:
    description: "stage: where the workers keep their caches ({home, root, sglang_build_dir, env}; {}: none)."
    type: dict
    default: {}
  retry_failed:
    description: "stage: deploy a release that failed its gates before."
    type: bool
    default: false
  release_id:
    description: "accept, fail, activate: the release (accept and fail default to the current one)."
    type: str
  reason:
    description: "fail, activate: why (the gate that failed; the rollback)."
    type: str
    default: ""
  to:
    description: "put_back: the release to put back; default the newest accepted one still installed."
    type: str
  keep:
    description: "accept: accepted releases kept, the current one included."
    type: int
    default: 3
  keep_revisions:
    description: "accept: checkpoint revisions kept, the current one included."
    type: int
    default: 2
  min_free_bytes:
    description: "accept: prune older releases early while the model filesystem has less free than this."
    type: int
    default: 0
  venvs_root:
    description: "accept: the directory holding the SGLang venvs (only venvs directly in it are removed)."
    type: path
  model_root:
    description: "accept: the directory of the checkpoint revisions (only those directly in it are removed)."
    type: path
"""

EXAMPLES = r"""
- name: Record the release of the rendered programs
  pd_release:
    action: stage
    state_dir: "{{ release_state_dir }}"
    conf_dir: "{{ serving_supervisor_config_dir }}/conf.d"
    programs: {prefill: {role: prefill, health_url: "http://127.0.0.1:30000/health"}}
    sglang_venv: "{{ appliance_sglang_venv }}"
    sglang_version: "{{ sglang_version }}"
    sglang_series: "{{ sglang_patch_series_dir | pd_release_series }}"
    model_dir: "{{ appliance_model_dir }}"
    repo_id: "{{ checkpoint_repo_id }}"
  vars:
    ansible_python_interpreter: "{{ appliance_tools_python }}"
"""

RETURN = r"""
release:
  description: The release record (id, label, parts) for stage, accept, put_back, activate.
  returned: success
  type: dict
change:
  description: "stage: {parts, programs, switch} against the previous current release."
  returned: stage
  type: dict
summary:
  description: "status, accept: current release, its status, accepted ones, failed ones, rollback target."
  returned: status, accept
  type: dict
host_state:
  description: >-
    stage, accept, fail, activate, status: the host state's C(release) key (pd_host_state writes it):
    C({current, status, label, accepted}), accepted being the newest accepted release.
  returned: success, except put_back
  type: dict
"""

from pathlib import Path  # noqa: E402 - Ansible wants DOCUMENTATION first
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402

ACTIONS = ["stage", "accept", "fail", "put_back", "activate", "status"]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "required": True, "choices": ACTIONS},
            "state_dir": {"type": "path", "required": True},
            "conf_dir": {"type": "path"},
            "programs": {"type": "dict", "default": {}},
            "sglang_venv": {"type": "path"},
            "sglang_version": {"type": "str"},
            "sglang_series": {"type": "list", "elements": "dict", "default": []},
            "model_dir": {"type": "path"},
            "repo_id": {"type": "str"},
            "variant": {"type": "dict", "default": {}},
            "workers": {"type": "bool", "default": True},
            "supervisor": {"type": "dict", "default": {}},
            "caches": {"type": "dict", "default": {}},
            "retry_failed": {"type": "bool", "default": False},
            "release_id": {"type": "str"},
            "reason": {"type": "str", "default": ""},
            "to": {"type": "str"},
            "keep": {"type": "int", "default": 3},
            "keep_revisions": {"type": "int", "default": 2},
            "min_free_bytes": {"type": "int", "default": 0},
            "venvs_root": {"type": "path"},
            "model_root": {"type": "path"},
        },
        required_if=[
            ("action", "stage", ("conf_dir", "sglang_venv", "sglang_version", "model_dir", "repo_id")),
            ("action", "accept", ("venvs_root", "model_root")),
            ("action", "activate", ("release_id",)),
        ],
        supports_check_mode=True,
    )
    with tools_venv(
        module,
        "pd_appliance.release is not importable by {python} ({err}): run pd_release with"
        " the tools venv (ansible_python_interpreter: appliance_tools_python)",
    ):
        from pd_appliance.release import ReleaseError
    try:
        module.exit_json(**run(module.params, module.check_mode, module.warn))
    except ReleaseError as err:
        module.fail_json(msg=err.message)


def run(p: dict[str, Any], dry: bool, warn: Any) -> dict[str, Any]:
    """One action; returns the module result."""
    from pd_appliance.release import ReleaseError
    from pd_appliance.release import host as release_host
    from pd_appliance.release.record import caches_part, compare
    from pd_appliance.release.store import ACCEPTED, ReleaseStore

    state_dir = Path(p["state_dir"])
    if p["action"] == "stage":
        paths = release_host.HostPaths(state_dir, Path(p["conf_dir"]))
        parts: dict[str, Any] = {"sglang": {}, "checkpoint": {}}
        if p["workers"]:
            parts = release_host.installed_parts(
                Path(p["sglang_venv"]),
                p["sglang_version"],
                p["sglang_series"],
                Path(p["model_dir"]),
                p["repo_id"],
            )
        parts["caches"] = caches_part(p["caches"] if p["workers"] else {})
        if dry and not paths.conf_dir.is_dir():
            return {"changed": True, "parts": parts, "msg": "check mode: no program rendered yet to record"}
        result = release_host.stage(
            paths, parts, p["programs"], p["variant"], retry_failed=p["retry_failed"], dry_run=dry,
            supervisor=p["supervisor"],
        )  # fmt: skip
        for warning in result.pop("warnings"):
            warn(warning)
        return result
    store = ReleaseStore(state_dir, dry_run=dry)
    if p["action"] == "status":
        return {"changed": False, "summary": store.summary(), "host_state": store.pointers()}
    if p["action"] in ("accept", "fail"):
        rid = p["release_id"] or store.current_id
        if not rid:
            raise ReleaseError(f"no current release in {state_dir}: nothing to {p['action']}")
        if p["action"] == "fail":
            store.fail(rid, p["reason"])
            return {"changed": True, "release_id": rid, "host_state": store.pointers()}
        was = store.status_of(rid)
        store.accept(rid)
        pruned = store.prune(
            p["keep"], p["keep_revisions"], Path(p["venvs_root"]), Path(p["model_root"]),
            min_free_bytes=p["min_free_bytes"],
        )  # fmt: skip
        return {
            "changed": was != ACCEPTED or bool(pruned.pruned or pruned.removed_paths),
            "release_id": rid,
            "prune": pruned.to_dict(),
            "summary": store.summary(),
            "host_state": store.pointers(),
        }
    if p["action"] == "put_back":
        supervisor = store.state.get("supervisor") or {}
        conf_dir = p["conf_dir"] or supervisor.get("conf_dir")
        if not conf_dir:
            raise ReleaseError(
                f"{state_dir}/state.json does not say where the program sections are: run the serve stage"
                " once (it records it) or pass conf_dir"
            )
        paths = release_host.HostPaths(state_dir, Path(conf_dir))
        store, target, current, skipped = release_host.rollback_plan(paths, p["to"])
        touched = release_host.put_back(paths, target, current, dry_run=dry)
        programs = {
            n: {"role": m.get("role"), "health_url": m.get("health_url")} for n, m in target.programs.items()
        }
        return {
            "changed": bool(touched), "release": target.to_dict(), "current": current.id if current else None,
            "files": touched, "skipped": skipped, "change": compare(current, target).to_dict(),
            "programs": programs, "supervisor": supervisor,
        }  # fmt: skip
    # activate
    changed = store.current_id != p["release_id"]
    if changed:
        store.activate(p["release_id"], p["reason"])
    current = store.current()
    return {
        "changed": changed,
        "release": current.to_dict() if current else None,
        "host_state": store.pointers(),
    }


if __name__ == "__main__":
    main()
