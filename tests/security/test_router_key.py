"""README (Security): unset, the router key is generated on the controller and kept in
artifacts/credentials/ (0600).

The key's expression, as the lab inventory and the serving role's defaults write it, is templated by
Ansible on this machine (one ad-hoc `ansible localhost` run each, a few seconds) with
appliance_credentials_dir in a temporary directory and the most permissive umask; the file it leaves
must be 0600 in a 0700 directory, hold a 48-character key, and give the same key the next time.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pd_testlib import ROOT, ansible_env

SOURCES = {
    "lab inventory": ROOT / "inventory/lab/group_vars/all/serving.yml",
    "serving role default": ROOT / "roles/serving/defaults/main.yml",
}


def _template_key(expression: str, credentials: Path, tmp_path: Path) -> str:
    """The key's length, as Ansible templates `expression` (the key itself is never printed)."""
    values = tmp_path / "vars.json"
    values.write_text(
        json.dumps({"serving_router_api_key": expression, "appliance_credentials_dir": str(credentials)})
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-m", "ansible.builtin.debug", "-a", "msg=length={{ serving_router_api_key | length }}",
         "-e", f"@{values}"],
        cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=120, check=False, umask=0,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_the_generated_router_key_is_0600(source: str, tmp_path: Path) -> None:
    expression = yaml.safe_load(SOURCES[source].read_text())["serving_router_api_key"]
    credentials = tmp_path / "artifacts" / "credentials"
    assert "length=48" in _template_key(expression, credentials, tmp_path)
    key_file = credentials / "serving_router_api_key"
    assert oct(stat.S_IMODE(key_file.stat().st_mode)) == "0o600", source
    assert oct(stat.S_IMODE(credentials.stat().st_mode)) == "0o700", source
    key = key_file.read_text().strip()
    assert len(key) == 48 and key.isalnum()
    # Kept: the next run reads the same key back instead of generating another.
    _template_key(expression, credentials, tmp_path)
    assert key_file.read_text().strip() == key
