"""The host-state fact (pd_appliance.host_state, plugins/modules/pd_host_state and its action plugin).

The library: keys merged (a writer changes only its own), unknown keys refused, the file written
only when it changes, by a rename, 0644, nothing in dry-run, a damaged file named. Through Ansible:
what the module writes, fact gathering with fact_path returns as ansible_local.pd_appliance, and
the rest of the run reads the new state without gathering again (other local facts kept).
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
import yaml

from pd_appliance import host_state
from pd_testlib import run_playbook


def test_a_writer_sets_only_its_keys_and_an_unchanged_update_writes_nothing(tmp_path: Path) -> None:
    path = host_state.fact_path(tmp_path / "etc/ansible/facts.d")
    assert path.name == "pd_appliance.fact" and host_state.read(path) == {}
    first = host_state.update(path, {"release": {"current": "r1", "accepted": None}})
    assert first.changed and first.before == {}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    second = host_state.update(path, {"variant": {"name": "mtp-1", "vars": {"a": (1, 2)}}})
    assert second.after == {
        "release": {"current": "r1", "accepted": None},
        "variant": {"name": "mtp-1", "vars": {"a": [1, 2]}},
    }
    assert json.loads(path.read_text()) == second.after
    mtime = path.stat().st_mtime_ns
    again = host_state.update(path, {"variant": {"name": "mtp-1", "vars": {"a": [1, 2]}}})
    assert not again.changed and path.stat().st_mtime_ns == mtime
    dropped = host_state.update(path, {}, ["variant"])
    assert dropped.changed and host_state.read(path) == {"release": {"current": "r1", "accepted": None}}
    # No temporary file is left beside it.
    assert [p.name for p in path.parent.iterdir()] == ["pd_appliance.fact"]


def test_dry_run_reports_the_change_and_writes_nothing(tmp_path: Path) -> None:
    path = host_state.fact_path(tmp_path)
    done = host_state.update(path, {"checkpoint": {"refs": {"main": "a" * 40}}}, dry_run=True)
    assert done.changed and done.after == {"checkpoint": {"refs": {"main": "a" * 40}}}
    assert not path.exists()


def test_unknown_keys_and_a_damaged_file_are_refused_naming_the_file(tmp_path: Path) -> None:
    path = host_state.fact_path(tmp_path)
    with pytest.raises(host_state.HostStateError, match="unknown host state keys \\['releases'\\]"):
        host_state.update(path, {"releases": {}})
    path.write_text("{not json")
    with pytest.raises(host_state.HostStateError, match=f"{path} is not JSON.*remove it"):
        host_state.update(path, {"release": {}})
    path.write_text("[1]")
    with pytest.raises(host_state.HostStateError, match="holds a list"):
        host_state.read(path)


PLAY = """
- name: Write, read in memory, gather again
  hosts: localhost
  gather_facts: false
  vars:
    ansible_python_interpreter: "{python}"
    facts_dir: "{facts_dir}"
  tasks:
    - name: Gather the local facts
      ansible.builtin.setup:
        gather_subset: ["!all", "!min", "local"]
        fact_path: "{{{{ facts_dir }}}}"
    - name: Before
      ansible.builtin.copy:
        content: "{{{{ ansible_local | to_json }}}}"
        dest: "{{{{ facts_dir }}}}/../before.json"
        mode: "0644"
    - name: Write the variant
      pd_host_state:
        facts_dir: "{{{{ facts_dir }}}}"
        values: {{variant: {{name: mtp-1}}}}
      register: wrote
    - name: Write it again
      pd_host_state:
        facts_dir: "{{{{ facts_dir }}}}"
        values: {{variant: {{name: mtp-1}}}}
      register: again
    - name: In memory
      ansible.builtin.copy:
        content: "{{{{ {{'local': ansible_local, 'changed': [wrote.changed, again.changed]}} | to_json }}}}"
        dest: "{{{{ facts_dir }}}}/../memory.json"
        mode: "0644"
    - name: Gather again
      ansible.builtin.setup:
        gather_subset: ["!all", "!min", "local"]
        fact_path: "{{{{ facts_dir }}}}"
    - name: After
      ansible.builtin.copy:
        content: "{{{{ ansible_local | to_json }}}}"
        dest: "{{{{ facts_dir }}}}/../after.json"
        mode: "0644"
"""


def test_what_the_module_writes_the_run_and_the_next_gathering_read(tmp_path: Path) -> None:
    facts_dir = tmp_path / "etc/ansible/facts.d"
    facts_dir.mkdir(parents=True)
    (facts_dir / "other.fact").write_text('{"kept": true}')
    host_state.write(host_state.fact_path(facts_dir), {"release": {"current": "r1"}})
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY.format(python=sys.executable, facts_dir=facts_dir))
    done = run_playbook(playbook, "localhost,", "-c", "local", "-v")
    assert done.returncode == 0, done.stdout[-3000:]
    state = {"release": {"current": "r1"}, "variant": {"name": "mtp-1"}}
    seen = {
        name: json.loads((facts_dir.parent / f"{name}.json").read_text())
        for name in ("before", "memory", "after")
    }
    assert seen["before"] == {"other": {"kept": True}, "pd_appliance": {"release": {"current": "r1"}}}
    # Written once (the second write changes nothing); the run reads it without gathering again.
    assert seen["memory"] == {
        "local": {"other": {"kept": True}, "pd_appliance": state},
        "changed": [True, False],
    }
    assert seen["after"] == {"other": {"kept": True}, "pd_appliance": state}
    assert yaml.safe_load((facts_dir / "pd_appliance.fact").read_text()) == state


def test_describe_says_release_variant_and_checkpoint_in_one_line() -> None:
    assert host_state.describe({}) == "no release recorded; no adopted variant; no checkpoint recorded"
    line = host_state.describe(
        {
            "release": {"current": "r-2", "status": "candidate", "label": "sglang 0.5.23", "accepted": "r-1"},
            "variant": {"name": "mtp-1", "vars": {}, "adopted_at": "2026-12-05T21:00:00Z"},
            "checkpoint": {"revision": "main", "commit": "c" * 40, "refs": {"main": "c" * 40}},
        }
    )
    assert line == (
        "release r-2 [candidate]; newest accepted r-1; variant mtp-1 (adopted 2026-12-05T21:00:00Z);"
        f" checkpoint main = {'c' * 40}"
    )
    pinned = host_state.describe({"checkpoint": {"revision": "c" * 40, "commit": "c" * 40}})
    assert pinned.endswith(f"checkpoint {'c' * 40}")
