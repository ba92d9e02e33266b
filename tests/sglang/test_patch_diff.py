"""Unit tests of the strict unified-diff applier (no wheel needed)."""

from __future__ import annotations

import pytest

from pd_appliance.patches.diff import PatchError, apply_file_patch, parse_patch

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 21))

PATCH = """Header text: what, why, and the measurement.
It may mention a/b paths or @@ freely above the first file header.

--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -4,3 +4,4 @@
 line 4
-line 5
+line five
+line 5.5
 line 6
@@ -15,2 +16,2 @@
 line 15
-line 16
+line sixteen
"""


def test_applies_hunks_and_ignores_the_header() -> None:
    [fp] = parse_patch(PATCH, "0001-x.patch")
    assert fp.path == "pkg/mod.py" and len(fp.hunks) == 2
    out = apply_file_patch(ORIGINAL, fp, "0001-x.patch").splitlines()
    assert out[3:7] == ["line 4", "line five", "line 5.5", "line 6"]
    assert out[15:17] == ["line 15", "line sixteen"]
    assert len(out) == 21


def test_hunk_moves_by_offset_when_upstream_lines_shift() -> None:
    [fp] = parse_patch(PATCH, "p")
    shifted = "new first line\nanother\n" + ORIGINAL
    out = apply_file_patch(shifted, fp, "p").splitlines()
    assert out[5:8] == ["line 4", "line five", "line 5.5"]


def test_failure_names_patch_hunk_file_and_line() -> None:
    [fp] = parse_patch(PATCH, "0002-broken.patch")
    changed = ORIGINAL.replace("line 16\n", "line XVI\n")
    with pytest.raises(PatchError) as err:
        apply_file_patch(changed, fp, "0002-broken.patch")
    msg = str(err.value)
    assert "0002-broken.patch" in msg and "hunk #2" in msg and "@@ -15,2 +16,2 @@" in msg
    assert "pkg/mod.py" in msg and "'line XVI'" in msg and "'line 16'" in msg


def test_no_fuzz_a_single_changed_context_line_fails() -> None:
    [fp] = parse_patch(PATCH, "p")
    with pytest.raises(PatchError, match="hunk #1"):
        apply_file_patch(ORIGINAL.replace("line 6\n", "line 6 \n"), fp, "p")


def test_creates_a_new_file_and_refuses_to_overwrite_one() -> None:
    text = "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n"
    [fp] = parse_patch(text, "p")
    assert fp.old_path is None
    assert apply_file_patch(None, fp, "p") == "a = 1\nb = 2\n"
    with pytest.raises(PatchError, match="already exists"):
        apply_file_patch("x = 0\n", fp, "p")


def test_missing_newline_at_end_of_file() -> None:
    eof = "\\ No newline at end of file\n"
    text = f"--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n one\n-two\n{eof}+zwei\n{eof}"
    [fp] = parse_patch(text, "p")
    assert apply_file_patch("one\ntwo", fp, "p") == "one\nzwei"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("just prose, no diff\n", "not a unified diff"),
        ("--- sglang/x.py\n+++ sglang/x.py\n@@ -1 +1 @@\n-a\n+b\n", "not -p1"),
        ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "leaves the package"),
        ("--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-a\n+b\n", "truncated"),
        ("--- a/x.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n", "deleting files"),
    ],
)
def test_malformed_patches_are_rejected(text: str, match: str) -> None:
    with pytest.raises(PatchError, match=match):
        parse_patch(text, "bad.patch")
