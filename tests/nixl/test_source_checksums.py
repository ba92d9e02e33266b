"""UCX and NIXL sources need their sha256 (README "Supply chain"): the opt-in source build refuses
to start without one, before anything is downloaded, naming the variable and the URL."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from pd_appliance.supply import sources

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "filter"))
import pd_supply  # noqa: E402 - the role's filter, as Ansible loads it

UCX_URL = "https://github.com/openucx/ucx/releases/download/v1.19.0/ucx-1.19.0.tar.gz"
DIGEST = "a" * 64


def test_a_source_without_its_sha256_is_refused() -> None:
    errors = sources.sha256_errors("gpu1", "nixl_ucx_sha256", "", UCX_URL)
    assert errors == [
        f"gpu1: nixl_ucx_sha256 must be the sha256 of {UCX_URL} (64 hex digits; nixl_ucx_sha256 is empty). "
        "Run sha256sum on the tarball you qualified and set nixl_ucx_sha256."
    ]
    for bad in ("abc123", "g" * 64, "a" * 63, "sha256:" + DIGEST, "A" * 64):
        assert sources.sha256_errors("gpu1", "nixl_source_sha256", bad, UCX_URL), bad
    assert sources.sha256_errors("gpu1", "nixl_source_sha256", DIGEST, UCX_URL) == []


def test_the_nixl_role_refuses_both_sources_through_that_rule() -> None:
    """The source build's first check (roles/nixl/tasks/main.yml) runs the rule on both variables,
    through the filter Ansible loads; the shipped defaults leave both empty, so both are refused."""
    task = next(t for t in yaml.safe_load((ROOT / "roles/nixl/tasks/main.yml").read_text())
                if t["name"] == "Source build settings are complete")  # fmt: skip
    expression = task["vars"]["nixl_source_problems"]
    for variable, url in (("nixl_ucx_sha256", "nixl_ucx_url"), ("nixl_source_sha256", "nixl_source_url")):
        assert f"{variable} | pd_sha256_errors(inventory_hostname, '{variable}', {url})" in expression
    assert "nixl_install_method != 'source'" in expression
    defaults = yaml.safe_load((ROOT / "roles/nixl/defaults/main.yml").read_text())
    filters = pd_supply.FilterModule().filters()
    for variable, url in (("nixl_ucx_sha256", "nixl_ucx_url"), ("nixl_source_sha256", "nixl_source_url")):
        assert filters["pd_sha256_errors"](defaults[variable], "gpu1", variable, defaults[url]), variable
