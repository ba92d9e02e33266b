"""uv installs the test venvs from the sources pip is configured with (pd_appliance.supply.pip_sources)."""

from __future__ import annotations

from pathlib import Path

from pd_appliance.supply.pip_sources import flags_from_pip_config


def test_pip_config_becomes_uv_flags_env_over_files_and_missing_local_indexes_dropped(tmp_path: Path) -> None:
    local = tmp_path / "simple"
    local.mkdir()
    listing = "\n".join([
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        "global.index-url='https://mirror.example/simple'",
        f"global.extra-index-url='file://{local} file://{tmp_path}/absent'",
        "global.find-links='/srv/wheels'",
        ":env:.find-links='/opt/wheels /more/wheels'",
    ])  # fmt: skip
    assert flags_from_pip_config(listing) == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", f"file://{local}",
        "--find-links", "/opt/wheels", "--find-links", "/more/wheels",
    ]  # fmt: skip


def test_no_pip_configuration_leaves_uv_on_its_defaults() -> None:
    assert flags_from_pip_config("") == ["--index-strategy", "unsafe-best-match"]
