"""The stand-ins stay on their side of the seam: no product file knows a rehearsal from a lab.

Product files are what a lab host runs or the controller loads for it: roles/, playbooks/, plugins/,
src/pd_appliance/, site.yml and ansible.cfg (CONTRIBUTING.md, "Stand-ins, not modes"). They must
not mention simulated GPUs: a stand-in answers at the boundary (a pynvml-shaped module, sysfs
fixtures, a declared variable) and names itself there. ansible.cfg, the product's configuration,
names no path under standins/: a rehearsal adds its own through its environment.
"""

from __future__ import annotations

import configparser
import re
import subprocess

from pd_testlib import ROOT

PRODUCT = ("roles", "playbooks", "plugins", "src/pd_appliance", "site.yml", "ansible.cfg")
# The word, also inside identifiers (an appliance_simulated_gpus), not inside other words.
WORD = re.compile(r"(?<![a-z])simulated(?![a-z])", re.IGNORECASE)


def product_files() -> list[str]:
    """The tracked product files (git's list: no caches, no build outputs)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *PRODUCT], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file())


def mentioning(files: list[str]) -> set[str]:
    return {name for name in files if WORD.search((ROOT / name).read_text(errors="replace"))}


def test_the_product_files_are_found() -> None:
    files = product_files()
    assert "site.yml" in files and "ansible.cfg" in files and "plugins/modules/pd_nvml_facts.py" in files


def test_no_product_file_mentions_simulated_gpus() -> None:
    mention = sorted(mentioning(product_files()))
    assert mention == [], (
        f"product files that mention simulated GPUs: {mention}. The product reads GPUs through NVML "
        "and the PCI bus (preflight_sysfs_root) only; what a stand-in must say comes from the stand-in "
        "(standins/, CONTRIBUTING.md 'Stand-ins, not modes')"
    )


def test_the_check_sees_a_mention_in_any_case_and_only_the_word() -> None:
    assert WORD.search("# the Simulated GPUs' node") and WORD.search("selectattr('simulated')")
    assert WORD.search("appliance_simulated_gpus") and WORD.search("SIMULATED_GPU_NAME")
    assert not WORD.search("simulation, simulator, dissimulated")


def test_ansible_cfg_names_no_standin_path() -> None:
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "ansible.cfg")
    paths = {
        f"[{section}] {key}": value
        for section in config.sections()
        for key, value in config.items(section)
        if "standins" in value
    }
    assert paths == {}, (
        f"ansible.cfg names stand-in paths (a rehearsal adds its own in its environment): {paths}"
    )
