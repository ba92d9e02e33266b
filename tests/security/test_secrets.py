"""Secrets stay secret: planted fake secrets reach only the 0600 env files, through a whole play.

Distinctive fake secrets are given the way a user gives them: the router API key and the Hub token
with `pd-appliance deploy -e` (the CLI path whose run records the README promises are redacted), the
supervisor's inet password in an `-e @file`. The whole site.yml runs on a private rehearsal (the shared
converge, tests/converged_site.py), then the day-2 profile and collect-diagnostics playbooks. From
before the first play a sampler reads every process's /proc/<pid>/cmdline several times a second.
Afterwards every file under the rehearsal root, the run records this session created under
artifacts/runs, and the site's artifacts directory (validation reports, the diagnostics bundle
unpacked), every file under /tmp written since the site was started and everything under ~/.ansible
are searched for the secrets. Allowed: the programs' 0600 env files (the launcher reads them) and
nothing else. The sampler also watches the private file `pd-appliance deploy` hands the -e values to
Ansible in: it must be 0600 whenever it exists.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest
import yaml

from converged_site import ROUTER_KEY, SECRETS, ConvergedSite
from pd_testlib import ROOT

pytestmark = pytest.mark.slow


def _files_holding_secrets(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*") if root.exists() else []:
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            for secret in SECRETS:
                if secret.encode() in data:
                    found.append(f"{path} holds {secret}")
    return found


def _new_files_holding_secrets(top: Path, since: float, skip: tuple[Path, ...]) -> tuple[list[str], int]:
    """Files under `top` written since `since` (regular files up to 256 MiB, unreadable ones passed
    over) that hold a secret; `skip` paths (files or directories) are left out.

    Returns (leaks, files read)."""
    found, read = [], 0
    for directory, dirs, files in os.walk(top, onerror=lambda _: None):
        dirs[:] = [d for d in dirs if Path(directory, d) not in skip]
        for name in files:
            path = Path(directory, name)
            with contextlib.suppress(OSError):
                info = path.lstat()
                if (
                    path in skip
                    or not stat.S_ISREG(info.st_mode)
                    or info.st_mtime < since
                    or info.st_size > 2**28
                ):
                    continue
                data = path.read_bytes()
                read += 1
                found += [f"{path} holds {secret}" for secret in SECRETS if secret.encode() in data]
    return found, read


@pytest.mark.timeout(3600)
def test_planted_secrets_reach_only_the_env_files(converged_site: ConvergedSite, tmp_path: Path) -> None:
    site = converged_site
    site.require_deploy()
    root = site.root
    artifacts = site.artifacts
    day2_vars = tmp_path / "day2.yml"
    day2_vars.write_text(yaml.safe_dump({"day2_profile_requests": 4, "day2_profile_trace_timeout_s": 30}))
    for playbook in ("playbooks/day2/profile.yml", "playbooks/day2/collect-diagnostics.yml"):
        result = site.play(playbook, "-e", f"@{day2_vars}", timeout=900)
        assert result.returncode == 0, f"{playbook}: {result.stdout[-4000:]}"
    sampler = site.sampler

    assert sampler.samples > 20, "the /proc sampler did not run through the play"
    assert sampler.hits == [], f"a secret was on a command line: {sampler.hits[:5]}"
    assert not [s for s in SECRETS for out in site.outputs if s in out], "a secret reached ansible's output"

    # The secrets did arrive where they belong: the router key in the programs' env files.
    env_files = sorted((root / "etc" / "pd-appliance" / "serving").glob("*.env"))
    assert env_files and all(ROUTER_KEY in p.read_text() for p in env_files)
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in env_files)

    bundles = list((artifacts / "diagnostics").glob("*.tar.gz"))
    assert bundles, "collect-diagnostics left no bundle"
    unpacked = tmp_path / "unpacked"
    for bundle in bundles:
        with tarfile.open(bundle) as tar:
            tar.extractall(unpacked, filter="data")
    new_runs = [p for p in (ROOT / "artifacts" / "runs").glob("*") if p not in site.runs_before]
    assert new_runs, "pd-appliance recorded no run"
    leaks = [
        leak
        for leak in _files_holding_secrets(root, artifacts, unpacked, *new_runs)
        if not leak.startswith(str(root / "etc" / "pd-appliance" / "serving")) or ".env holds" not in leak
    ]
    assert leaks == [], leaks
    searched = sum(1 for r in (root, artifacts, unpacked, *new_runs) for p in r.rglob("*") if p.is_file())

    # The -e values reached Ansible through pd-appliance's private file, 0600 whenever it was seen.
    assert sampler.extra_vars_modes, "the sampler never saw pd-appliance's private -e file"
    assert {oct(mode) for mode in sampler.extra_vars_modes.values()} == {"0o600"}, sampler.extra_vars_modes

    # Nothing the plays wrote anywhere in /tmp, nor anything under ~/.ansible, holds a secret. Left out:
    # the user's own vars file (what a user writes for -e @file) and the allowed env files under the
    # site's root (it lives in /tmp). The secrets are this session's own, so other runs cannot match.
    skip = (site.vars_file, root / "etc" / "pd-appliance" / "serving")
    in_tmp, read_tmp = _new_files_holding_secrets(Path(tempfile.gettempdir()), site.started - 1, skip)
    in_home, read_home = _new_files_holding_secrets(Path.home() / ".ansible", 0.0, ())
    assert in_tmp == [] and in_home == [], in_tmp + in_home
    print(
        f"searched {searched} files, {read_tmp} new files in /tmp, {read_home} under ~/.ansible and "
        f"{sampler.samples} /proc samples; no secret outside the env files"
    )
