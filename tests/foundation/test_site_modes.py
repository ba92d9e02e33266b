"""The conventions a lab user relies on, on the rehearsal: `--check --diff` runs to the end on a fresh
host and on a converged one, and every tag a stage playbook defines runs alone.

The converge is the shared one (tests/converged_site.py: private root and ports, the Hub stand-in
started the way `make rehearse` starts it): fresh --check -> converge -> here: converged --check
(changes nothing it would not report) -> each tag alone.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from converged_site import ConvergedSite
from pd_testlib import ROOT, recap

pytestmark = pytest.mark.slow

# The stages README.md names as tags (`ansible-playbook site.yml -i inventory/lab --tags checkpoint`).
STAGE_TAGS = ("preflight", "provision", "checkpoint", "serve", "validate", "monitor")


def playbook_tags() -> list[str]:
    """Every tag a stage playbook defines on its plays and roles (besides `always`): each must run alone."""
    found: set[str] = set()
    for path in [ROOT / "site.yml", *sorted((ROOT / "playbooks").glob("*.yml"))]:
        for match in re.finditer(r"^\s*tags:\s*\[([^\]]*)\]", path.read_text(), re.MULTILINE):
            found.update(t.strip() for t in match.group(1).split(",") if t.strip())
    found.discard("always")
    # Molecule's own tag (its idempotence pass skips what carries it: playbooks/validate.yml's
    # measurement, tuning and gate), not one a lab user runs alone.
    found.discard("molecule-idempotence-notest")
    return sorted(found)


def _ok(result: subprocess.CompletedProcess[str] | None) -> str:
    assert result is not None, "not run: an earlier step of the shared converge failed"
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    return output


@pytest.mark.timeout(3600)
def test_check_diff_runs_to_the_end_on_a_fresh_host_and_creates_nothing(
    converged_site: ConvergedSite,
) -> None:
    fresh = _ok(converged_site.fresh_check)
    assert "PLAY [Validate" in fresh, "check mode must run to the last stage"
    assert "PLAY [Monitor" in fresh, "check mode must run to the last stage"
    assert converged_site.created_by_check == [], "check mode created what only a converge may create"


@pytest.mark.timeout(3600)
def test_converged_check_changes_nothing_and_every_tag_runs_alone(converged_site: ConvergedSite) -> None:
    converged_site.require_deploy()
    converged = converged_site.play("site.yml", "--check", "--diff")
    _ok(converged)
    assert recap(converged.stdout)["changed"] == 0, converged.stdout[-5000:]

    tags = playbook_tags()
    assert set(STAGE_TAGS) <= set(tags) and {"tools", "nixl", "sglang", "driver"} <= set(tags), tags
    for tag in tags:
        # --tags nixl runs forced: a proof whose record matches runs again when asked to.
        forced = ("-e", "appliance_force_checks=true") if tag == "nixl" else ()
        if tag == "sglang":
            # A patched file edited by hand changes the SGLang venv's state: its steps run again
            # and restore it, while the lock proof, whose inputs did not change, stays skipped.
            patched = _edit_a_patched_file(converged_site.root)
        alone = converged_site.play("site.yml", "--tags", tag, *forced)
        output = _ok(alone)
        flat = " ".join(output.split())
        if tag == "provision":
            # Nothing the proofs read changed since the converge proved it: they are skipped, and say so.
            assert "PROOF SKIPPED: SGLang venv: inputs unchanged since" in flat, flat[-3000:]
            assert "PROOF SKIPPED: NIXL check: inputs unchanged since" in flat, flat[-3000:]
            # The driver and NIXL stages run before the checkpoint stage, yet on a converged host
            # they judge the fabric by the KV need of the checkpoint there (checkpoint_revision is a
            # branch: the facts play reads the commit it resolved to).
            assert "KV need per prefill -> decode TP rank pair" in flat, flat[-3000:]
            assert "KV need unknown" not in flat, flat[-3000:]
        if tag == "tools":
            assert "PROOF SKIPPED: tools and router venvs: inputs unchanged since" in flat, flat[-3000:]
        if tag == "sglang":
            assert "PROOF SKIPPED: SGLang venv" not in flat, flat[-3000:]
            assert "PROOF SKIPPED: lock proof: inputs unchanged since" in flat, flat[-3000:]
            assert hashlib.sha256(patched[0].read_bytes()).hexdigest() == patched[1], "the patch is back"
        if forced:
            assert "PROOF SKIPPED: NIXL check" not in flat, flat[-3000:]
            ran = re.search(r"TASK \[nixl : Run the NIXL check\][^\n]*\n(ok|changed):", output)
            assert ran, output[-3000:]
        if tag in STAGE_TAGS:
            assert re.search(rf"PLAY \[{tag.capitalize()}", output, re.IGNORECASE), (
                f"--tags {tag} ran no {tag} play"
            )
        else:
            assert re.search(r"^TASK \[", output, re.MULTILINE), f"--tags {tag} ran no task"
        if tag == "provision":
            # A second provision on a converged host changes nothing (the lock proven, the venvs
            # in place, the patch series applied once).
            changed = re.findall(r"TASK \[([^\]]+)\][^\n]*\nchanged:", alone.stdout)
            assert recap(alone.stdout)["changed"] == 0, f"--tags provision changed: {changed}"


def _edit_a_patched_file(root: Path) -> tuple[Path, str]:
    """Append a line to a file the patch series patched; returns it and its patched sha256."""
    [marker] = (root / "opt/pd-appliance/sglang").glob("*/pd-appliance-patches.json")
    [site] = marker.parent.glob("lib/python3*/site-packages")
    rel, state = sorted(json.loads(marker.read_text())["files"].items())[0]
    with (site / rel).open("a") as handle:
        handle.write("# edited by hand\n")
    return site / rel, state["patched_sha256"]


def test_the_converged_report_has_the_roofline_of_its_layout(converged_site: ConvergedSite) -> None:
    """docs/roofline.md in the validation report: the running layout's decode (four simulated GPUs at
    the stand-in NVML's 1,792 GB/s) and the stand-in checkpoint's tensors, a limit and an efficiency
    at each measured level, and the section named a stand-in."""
    converged_site.require_deploy()
    report = json.loads(next(converged_site.artifacts.glob("validation/**/report.json")).read_text())
    roof = report["roofline"]
    assert (roof["decode_tp_sizes"], round(roof["bandwidth_gb_s"])) == ([4], 1792), roof
    assert set(roof["levels"]) == {"bs=1", "C=16"}
    for level in roof["levels"].values():
        assert level["efficiency"] == level["measured_tok_s"] / level["limit_tok_s"] > 0
    assert roof["stand_in"].startswith("STAND-IN")
