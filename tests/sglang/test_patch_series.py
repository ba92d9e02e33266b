"""The patch series against the real pinned sglang wheel: apply, idempotence, change, failure."""

from __future__ import annotations

import json
import py_compile
import shutil
import zipfile
from pathlib import Path

import pytest
from sglang_testlib import SERIES_DIR, SGLANG_VERSION, apply_to_site

from pd_appliance.patches import PatchError, apply_series, load_series
from pd_appliance.patches.series import read_record, record_hash

MODEL_HOOK = "sglang/srt/arg_groups/model_hook.py"
SM120_ENV = "sglang/srt/arg_groups/sm120_env.py"


def _apply(site: Path, series: Path, **kw):
    return apply_to_site(site, series, **kw)


def _record(site: Path) -> dict[str, str]:
    return read_record(site / f"sglang-{SGLANG_VERSION}.dist-info")


def _is_pristine(site: Path, rel: str) -> bool:
    return record_hash((site / rel).read_bytes()) == _record(site)[rel]


def _extra_patch(series: Path, name: str, old: str, new: str) -> None:
    """Append a one-line patch of model_hook.py (against the file after the earlier patches)."""
    (series / name).write_text(
        f"test patch {name}\n\n--- a/{MODEL_HOOK}\n+++ b/{MODEL_HOOK}\n@@ -1,2 +1,2 @@\n-{old}\n+{new}\n"
        ' """Server-argument resolution for per-model and per-capability adjustments."""\n'
    )
    with (series / "series").open("a") as fh:
        fh.write(name + "\n")


def test_repo_series_lists_every_patch_and_each_has_an_explaining_header() -> None:
    patches, warnings = load_series(SERIES_DIR)
    assert warnings == [], "every .patch in the folder must be listed in series"
    assert patches, "the series is empty"
    for name, data in patches:
        header = data.decode().split("\n--- ", 1)[0]
        assert len(header.split()) >= 30, f"{name}: the header must say what, why and the measurement"
        assert "--- a/" in data.decode() or "--- /dev/null" in data.decode()


def test_apply_then_rerun_changes_nothing(site_packages: Path) -> None:
    first = _apply(site_packages, SERIES_DIR)
    assert first.changed and first.action == "applied"
    assert not _is_pristine(site_packages, MODEL_HOOK)
    for path in first.patched_files:
        py_compile.compile(path, doraise=True)
    marker = json.loads((site_packages.parent / "marker.json").read_text())
    assert [p["name"] for p in marker["patches"]] == [n for n, _ in load_series(SERIES_DIR)[0]]
    assert all(len(p["sha256"]) == 64 for p in marker["patches"])
    before = {p: Path(p).read_bytes() for p in first.patched_files}
    second = _apply(site_packages, SERIES_DIR)
    assert not second.changed and second.action == "unchanged" and second.written_files == []
    assert {p: Path(p).read_bytes() for p in first.patched_files} == before


def test_check_mode_reports_change_and_writes_nothing(site_packages: Path) -> None:
    result = _apply(site_packages, SERIES_DIR, check_mode=True)
    assert result.changed
    assert _is_pristine(site_packages, MODEL_HOOK)
    assert not (site_packages / SM120_ENV).exists()
    assert not (site_packages.parent / "marker.json").exists()


def test_changed_series_restores_pristine_then_reapplies(site_packages: Path, series_copy: Path) -> None:
    _apply(site_packages, series_copy)
    only_0001 = (site_packages / MODEL_HOOK).read_bytes()
    _extra_patch(
        series_copy, "0099-test.patch", "# SPDX-License-Identifier: Apache-2.0", "# SPDX: patched twice"
    )
    second = _apply(site_packages, series_copy)
    assert second.changed and second.action == "reapplied"
    text = (site_packages / MODEL_HOOK).read_text()
    assert text.startswith("# SPDX: patched twice\n") and "force_env(" in text
    # Drop the extra patch again: the file must come back to exactly pristine + 0001.
    lines = (series_copy / "series").read_text().replace("0099-test.patch\n", "")
    (series_copy / "series").write_text(lines)
    (series_copy / "0099-test.patch").unlink()
    third = _apply(site_packages, series_copy)
    assert third.action == "reapplied"
    assert (site_packages / MODEL_HOOK).read_bytes() == only_0001


def test_emptied_series_restores_every_file_and_removes_created_ones(
    site_packages: Path, series_copy: Path
) -> None:
    _apply(site_packages, series_copy)
    (series_copy / "series").write_text("# nothing\n")
    for patch in series_copy.glob("*.patch"):
        patch.unlink()
    result = _apply(site_packages, series_copy)
    assert result.changed and result.patches == []
    assert _is_pristine(site_packages, MODEL_HOOK)
    assert not (site_packages / SM120_ENV).exists(), "a file created by a patch must go with it"
    assert str(site_packages / MODEL_HOOK) in result.restored_files


def test_reinstalled_files_are_repaired(site_packages: Path, sglang_wheel: Path) -> None:
    _apply(site_packages, SERIES_DIR)
    (site_packages / MODEL_HOOK).unlink()
    (site_packages / MODEL_HOOK).write_bytes(zipfile.ZipFile(sglang_wheel).read(MODEL_HOOK))
    result = _apply(site_packages, SERIES_DIR)
    assert result.changed and result.action == "repaired"
    assert "force_env(" in (site_packages / MODEL_HOOK).read_text()


def test_pristine_comes_from_the_wheel_when_the_saved_copy_is_gone(
    site_packages: Path, sglang_wheel: Path
) -> None:
    _apply(site_packages, SERIES_DIR)
    shutil.rmtree(site_packages.parent / "pristine")
    (site_packages / MODEL_HOOK).unlink()
    (site_packages / MODEL_HOOK).write_text("edited by hand\n")
    with pytest.raises(PatchError, match=r"no pristine copy of sglang/\S+\.py .*pass the wheel file"):
        _apply(site_packages, SERIES_DIR)
    result = _apply(site_packages, SERIES_DIR, wheel=sglang_wheel)
    assert result.action == "repaired" and "force_env(" in (site_packages / MODEL_HOOK).read_text()


def test_broken_patch_fails_naming_patch_and_hunk_and_changes_nothing(
    site_packages: Path, series_copy: Path
) -> None:
    _extra_patch(series_copy, "0098-broken.patch", "# not what upstream has", "# whatever")
    with pytest.raises(PatchError) as err:
        _apply(site_packages, series_copy)
    msg = str(err.value)
    assert "0098-broken.patch" in msg and "hunk #1" in msg and MODEL_HOOK in msg
    assert _is_pristine(site_packages, MODEL_HOOK), "a failed series must leave the package untouched"
    assert not (site_packages / SM120_ENV).exists()
    assert not (site_packages.parent / "marker.json").exists()


def test_patch_that_breaks_syntax_fails_before_writing(site_packages: Path, series_copy: Path) -> None:
    _extra_patch(
        series_copy,
        "0097-syntax.patch",
        "# SPDX-License-Identifier: Apache-2.0",
        "def broken(:",
    )
    with pytest.raises(PatchError, match=r"0097-syntax.patch: .*model_hook.py does not compile"):
        _apply(site_packages, series_copy)
    assert _is_pristine(site_packages, MODEL_HOOK)


def test_wrong_installed_version_is_named(site_packages: Path) -> None:
    with pytest.raises(PatchError, match=r"sglang 0.5.99 is not installed .*found sglang-0.5.23.dist-info"):
        apply_series(
            site_packages, SERIES_DIR, site_packages / "m.json", site_packages / "p", "sglang", "0.5.99"
        )


def test_series_naming_a_missing_patch_fails(series_copy: Path, site_packages: Path) -> None:
    with (series_copy / "series").open("a") as fh:
        fh.write("0042-not-there.patch\n")
    with pytest.raises(PatchError, match=r"lists 0042-not-there\.patch, but"):
        _apply(site_packages, series_copy)
