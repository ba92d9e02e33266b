"""pd_appliance.files.write_atomic, which every writer of state, records, manifests, patched sources
and supervisor sections uses: the content, mode and owner land in one rename; a failed write leaves
the old file and no temporary file; the parents are made unless the caller says not to."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pd_appliance import files


def test_text_and_bytes_replace_the_file_with_the_mode_asked(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "state.json"
    files.write_atomic(path, "größe\n")
    assert path.read_bytes() == "größe\n".encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    files.write_atomic(path, b"\x00\x01", mode=0o600)
    assert path.read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_without_make_parents_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        files.write_atomic(tmp_path / "absent" / "f", "x", make_parents=False)
    assert not (tmp_path / "absent").exists()


def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "record.json"
    path.write_text("old\n")

    def refuse(src: str, dst: str) -> None:
        assert Path(src).name.startswith(files.temporary_prefix(path)) and Path(src).read_text() == "new\n"
        raise OSError("disk said no")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError, match="disk said no"):
        files.write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_owner_is_set_before_the_rename_and_minus_one_keeps_one_id(tmp_path: Path) -> None:
    """Run as root, as CI runs (a chown to another uid needs it)."""
    path = tmp_path / "ref"
    files.write_atomic(path, "a\n", owner=(4321, 8765))
    assert (path.stat().st_uid, path.stat().st_gid) == (4321, 8765)
    files.write_atomic(path, "b\n", owner=(-1, 1234))
    assert (path.stat().st_uid, path.stat().st_gid) == (os.geteuid(), 1234)
