"""nvidia_driver_source: ubuntu-signed: the release checked against Ubuntu's archive, the signed module
package named from the running kernel and pinned to the build made against the userspace's release.

The apt answers are Ubuntu-shaped (package names, version strings and the module's Depends as
packages.ubuntu.com lists them, 2026-12-03); the role's own task file runs against a STAND-IN
apt-cache that prints them, so no Ubuntu archive is needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from pd_appliance.supply import ubuntu_driver
from pd_standins.apt_repo import build_deb, ubuntu_signed_packages
from pd_testlib import ROOT, run_playbook

USERSPACE = "nvidia-headless-no-dkms-580-server-open"
KERNEL = "6.14.0-36-generic"  # an HWE kernel of noble: uname -r says "generic" like the GA one
MODULE = f"linux-modules-nvidia-580-server-open-{KERNEL}"

_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
_SECURITY = "http://security.ubuntu.com/ubuntu"
MADISON = f"""\
{USERSPACE} | 580.173.02-0ubuntu0.24.04.1 | {_ARCHIVE} noble-updates/restricted amd64 Packages
{USERSPACE} | 580.173.02-0ubuntu0.24.04.1 | {_SECURITY} noble-security/restricted amd64 Packages
{USERSPACE} | 580.126.20-0ubuntu0.24.04.2 | {_ARCHIVE} noble-updates/restricted amd64 Packages
"""


def _stanza(version: str, driver: str) -> str:
    return textwrap.dedent(f"""\
        Package: {MODULE}
        Version: {version}
        Architecture: amd64
        Depends: linux-image-{KERNEL} | linux-image-unsigned-{KERNEL},
         nvidia-kernel-common-580-server (>= {driver})
        Description: STAND-IN shaped like Canonical's linux-restricted-modules package
        """)


SHOW = _stanza("6.14.0-36.36+1", "580.173.02") + "\n" + _stanza("6.14.0-36.36", "580.126.20")


def _plan(version: str, madison: str = MADISON, show: str = SHOW) -> ubuntu_driver.Plan:
    return ubuntu_driver.plan(
        madison,
        show,
        userspace_package=USERSPACE,
        module_package=MODULE,
        branch="580",
        version=version,
        host="gpu1",
    )


def test_a_release_the_archive_lacks_is_refused_naming_the_carried_ones() -> None:
    plan = _plan("580.159.04")  # NVIDIA's repository's release, which Ubuntu does not build
    assert plan.reachable and plan.carried == ["580.126.20", "580.173.02"]
    [problem] = plan.problems
    assert problem.startswith("gpu1: nvidia_driver_version 580.159.04 is not in Ubuntu's archive")
    assert f"({USERSPACE} carries 580.126.20, 580.173.02)" in problem


def test_the_module_build_is_the_one_made_against_the_userspace_release() -> None:
    newest = _plan("580.173.02")
    assert newest.problems == []
    assert (newest.userspace_version, newest.module_version) == (
        "580.173.02-0ubuntu0.24.04.1",
        "6.14.0-36.36+1",
    )
    older = _plan("580.126.20")
    assert (older.userspace_version, older.module_version) == ("580.126.20-0ubuntu0.24.04.2", "6.14.0-36.36")
    assert _plan("").driver == "580.173.02"


def test_no_module_build_for_the_release_or_the_kernel_is_refused() -> None:
    only_old = _stanza("6.14.0-36.36", "580.126.20")
    [problem] = _plan("580.173.02", show=only_old).problems
    assert f"{MODULE} exists in Ubuntu's archive for driver(s) 580.126.20 but not for 580.173.02" in problem
    [problem] = _plan("580.173.02", show="").problems
    assert f"has no {MODULE}" in problem and "linux-generic-hwe" in problem


def test_an_unreachable_archive_is_said_not_failed() -> None:
    plan = _plan("580.173.02", madison="", show="")
    assert not plan.reachable and plan.problems == []
    assert "unreachable" in plan.note and "580.173.02 was not checked" in plan.note


STANDIN_APT_CACHE = """\
#!/bin/sh
# STAND-IN for apt-cache (tests/driver/test_ubuntu_signed.py): Ubuntu-shaped answers, read from files.
case "$1" in
  madison) [ "$2" = {userspace} ] && cat {dir}/madison ;;
  show) [ "$2" = {module} ] && cat {dir}/show ;;
esac
exit 0
"""

PLAY = """
- name: The ubuntu-signed task file against a stand-in apt-cache
  hosts: prefill
  gather_facts: true
  environment:
    PATH: "{{ standin_bin }}:{{ ansible_env.PATH }}"
  roles:
    - role: appliance_defaults
  tasks:
    - name: The directory config.yml creates before the packages
      ansible.builtin.file:
        path: "{{ appliance_root }}/etc/apt/preferences.d"
        state: directory
        mode: "0755"
    - name: Run the role's ubuntu-signed choice
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: ubuntu_signed
      vars:
        nvidia_driver_source: ubuntu-signed
    - name: Keep what it chose
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ nvidia_driver_module_package }} {{ nvidia_driver_meta_package }}\\n"
        mode: "0644"
"""


@pytest.fixture
def standin_apt(tmp_path: Path) -> Path:
    kernel = os.uname().release
    module = f"linux-modules-nvidia-580-server-open-{kernel}"
    (tmp_path / "madison").write_text(MADISON)
    (tmp_path / "show").write_text(SHOW.replace(MODULE, module).replace(KERNEL, kernel))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apt-cache"
    script.write_text(STANDIN_APT_CACHE.format(userspace=USERSPACE, module=module, dir=tmp_path))
    script.chmod(0o755)
    return tmp_path


@pytest.mark.slow
def test_role_names_the_running_kernels_module_and_pins_the_matching_build(
    standin_apt: Path, rehearsal_inventory_copy: Path
) -> None:
    play = standin_apt / "play.yml"
    play.write_text(PLAY)
    out = standin_apt / "chosen.txt"
    args = ["-e", f"standin_bin={standin_apt / 'bin'}", "-e", f"out={out}"]
    # the lab inventory pins NVIDIA's repository release (580.159.04); ubuntu-signed needs Ubuntu's
    done = run_playbook(play, rehearsal_inventory_copy, *args, "-e", "nvidia_driver_version=580.173.02")
    assert done.returncode == 0, done.stdout[-3000:]
    kernel = os.uname().release
    assert out.read_text().split() == [f"linux-modules-nvidia-580-server-open-{kernel}", USERSPACE]
    root = rehearsal_inventory_copy.parent.parent / ".rehearsal" / "root"
    pin = (root / "etc/apt/preferences.d/00-pd-appliance-nvidia-modules.pref").read_text()
    assert f"Package: linux-modules-nvidia-580-server-open-{kernel}\nPin: version 6.14.0-36.36+1\n" in pin
    assert "Pin-Priority: 1001" in pin and "driver 580.173.02" in pin
    # NVIDIA's repository release is refused, naming what Ubuntu's archive carries
    refused = run_playbook(play, rehearsal_inventory_copy, *args, "-e", "nvidia_driver_version=580.159.04")
    flat = " ".join(refused.stdout.split())
    assert refused.returncode != 0
    assert "nvidia_driver_version 580.159.04 is not in Ubuntu" in flat
    assert f"({USERSPACE} carries 580.126.20, 580.173.02)" in flat


PREFLIGHT = """
- name: Preflight's archive check against a stand-in apt-cache
  hosts: prefill
  gather_facts: true
  environment:
    PATH: "{{ standin_bin }}:{{ ansible_env.PATH }}"
  tasks:
    - name: The nvidia_driver defaults, as preflight's argument-spec step loads them
      ansible.builtin.include_vars:
        file: "{{ playbook_dir_real }}/roles/nvidia_driver/defaults/main.yml"
        name: preflight_defaults_nvidia_driver
    - name: Preflight's check (main.yml includes it for ubuntu-signed GPU hosts on Ubuntu)
      ansible.builtin.include_role:
        name: preflight
        tasks_from: driver_archive
      vars:
        preflight_errors: []
    - name: Keep the findings
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ {'errors': preflight_errors, 'plan': preflight_driver_plan} | to_json }}"
        mode: "0644"
"""


@pytest.mark.slow
@pytest.mark.parametrize("reachable", [True, False])
def test_preflight_refuses_a_missing_release_and_says_when_the_archive_is_unreachable(
    standin_apt: Path, rehearsal_inventory_copy: Path, reachable: bool
) -> None:
    if not reachable:
        (standin_apt / "madison").write_text("")
        (standin_apt / "show").write_text("")
    play = standin_apt / "preflight.yml"
    play.write_text(PREFLIGHT)
    out = standin_apt / "findings.json"
    done = run_playbook(
        play,
        rehearsal_inventory_copy,
        "-e", f"standin_bin={standin_apt / 'bin'}", "-e", f"out={out}", "-e", f"playbook_dir_real={ROOT}",
        "-e", "nvidia_driver_source=ubuntu-signed",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    findings = json.loads(out.read_text())
    if reachable:  # the lab inventory's 580.159.04 is NVIDIA's numbering
        [error] = findings["errors"]
        assert "nvidia_driver_version 580.159.04 is not in Ubuntu's archive" in error
        assert f"({USERSPACE} carries 580.126.20, 580.173.02)" in error
    else:
        assert findings["errors"] == [] and not findings["plan"]["reachable"]
        assert "WARNING: localhost: apt knows no version of " + USERSPACE in " ".join(done.stdout.split())


APT_PLAY = """
- name: The ubuntu-signed task file against apt on a scratch root holding Ubuntu-shaped stand-ins
  hosts: prefill
  gather_facts: true
  environment:
    APT_CONFIG: "{{ apt_config }}"
  roles:
    - role: appliance_defaults
  tasks:
    - name: The role's release pin (config.yml), as the driver stage renders it first
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: config
    - name: Run the role's ubuntu-signed choice
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: ubuntu_signed
      vars:
        nvidia_driver_source: ubuntu-signed
    - name: Keep what it would install
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ nvidia_driver_ubuntu | to_json }}"
        mode: "0644"
"""


def _apt(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(argv, env=env, check=False, capture_output=True, text=True)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_real_apt_takes_the_module_build_of_the_userspace_release_not_the_newest(
    tmp_path: Path, rehearsal_inventory_copy: Path
) -> None:
    kernel = os.uname().release
    module = f"linux-modules-nvidia-580-server-open-{kernel}"
    repo = tmp_path / "repo"
    repo.mkdir()
    for pkg in ubuntu_signed_packages(kernel):
        build_deb(pkg, repo, tmp_path / "build")
    index = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True, capture_output=True
    ).stdout
    (repo / "Packages").write_bytes(index)
    root = rehearsal_inventory_copy.parent.parent / ".rehearsal" / "root"
    for d in ("var/lib/dpkg", "var/lib/apt/lists/partial", "var/cache/apt/archives/partial",
              "etc/apt/sources.list.d", "etc/apt/preferences.d", "etc/apt/apt.conf.d"):  # fmt: skip
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").write_text("")
    (root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    conf = tmp_path / "apt.conf"
    conf.write_text(f'Dir "{root}/";\nDir::State::status "{root}/var/lib/dpkg/status";\n'
                    'APT::Sandbox::User "root";\nAcquire::Languages "none";\n')  # fmt: skip
    env = {**os.environ, "APT_CONFIG": str(conf)}
    _apt(env, "apt-get", "update")
    base = f"{kernel.partition('-')[0]}-"
    assert f"Candidate: {base}" in _apt(env, "apt-cache", "policy", module)
    assert "+1" in _apt(env, "apt-cache", "policy", module).split("Candidate: ")[1].split()[0]  # newest

    out = tmp_path / "chosen.json"
    play = tmp_path / "play.yml"
    play.write_text(APT_PLAY)
    done = run_playbook(
        play,
        rehearsal_inventory_copy,
        "-e", f"apt_config={conf}", "-e", f"out={out}", "-e", "nvidia_driver_version=580.126.20",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    chosen = json.loads(out.read_text())
    assert chosen["userspace_version"] == "580.126.20-0ubuntu0.24.04.2"
    assert chosen["module_version"].startswith(base) and "+1" not in chosen["module_version"]
    # the role's pin (00-pd-appliance-nvidia-modules.pref) now makes it apt's candidate too
    policy = _apt(env, "apt-cache", "policy", module)
    assert f"Candidate: {chosen['module_version']}\n" in policy and "1001" in policy
    plan = _apt(env, "apt-get", "-s", "install", f"{USERSPACE}={chosen['userspace_version']}",
                f"{module}={chosen['module_version']}")  # fmt: skip
    assert f"Inst {module} ({chosen['module_version']} " in plan
    assert "Inst nvidia-kernel-common-580-server (580.126.20-0ubuntu0.24.04.2 " in plan
    # and packages.yml holds both: they are in the driver tree the role apt-mark holds
    tree = yaml.safe_load((ROOT / "roles/nvidia_driver/defaults/main.yml").read_text())[
        "nvidia_driver_tree_regex"
    ]
    assert re.match(tree, module) and re.match(tree, USERSPACE)
