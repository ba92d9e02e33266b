"""A strict unified-diff parser and applier for the SGLang patch series.

Why not GNU patch: it is not on every minimal image, it applies with fuzz (a hunk that lands on the
wrong lines is worse than one that fails), and its messages do not say which patch of a series
failed. This applier takes `-p1` paths (`a/sglang/...`), matches every context and removed line
exactly (a hunk may move by an offset, as upstream lines shift, never fuzz), works on text in
memory so a series either applies completely or changes nothing, and names the patch, the hunk and
the first line that did not match when it fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
DEV_NULL = "/dev/null"


class PatchError(Exception):
    """A patch that cannot be parsed or applied; the message names patch, file and hunk."""


@dataclass
class Hunk:
    """One `@@` block: the lines it expects (context and removals) and what it leaves."""

    number: int
    header: str
    old_start: int
    old_lines: list[str] = field(default_factory=list)
    new_lines: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    """The hunks for one file; `old_path` None means the patch creates the file."""

    old_path: str | None
    new_path: str
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path


def _strip_prefix(raw: str, patch_name: str) -> str | None:
    path = raw.split("\t", 1)[0].strip()
    if path == DEV_NULL:
        return None
    if not (path.startswith("a/") or path.startswith("b/")):
        raise PatchError(f"{patch_name}: path {path!r} is not -p1 (expected a/... or b/...)")
    rel = path[2:]
    if rel.startswith("/") or ".." in rel.split("/"):
        raise PatchError(f"{patch_name}: path {path!r} leaves the package directory")
    return rel


def parse_patch(text: str, patch_name: str) -> list[FilePatch]:
    """Parse a unified diff. Text above the first `--- ` line is the human header and is ignored."""
    lines = text.splitlines(keepends=True)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"{patch_name}: '--- ' on line {i + 1} is not followed by '+++ '")
        old = _strip_prefix(line[4:], patch_name)
        new = _strip_prefix(lines[i + 1][4:], patch_name)
        if new is None:
            raise PatchError(f"{patch_name}: deleting files ({old}) is not supported; empty it instead")
        fp = FilePatch(old_path=old, new_path=new)
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            i = _parse_hunk(lines, i, fp, patch_name)
        if not fp.hunks:
            raise PatchError(f"{patch_name}: {new} has a header but no hunks")
        files.append(fp)
    if not files:
        raise PatchError(f"{patch_name}: no '--- a/...' / '+++ b/...' file header found: not a unified diff")
    return files


def _parse_hunk(lines: list[str], i: int, fp: FilePatch, patch_name: str) -> int:
    header = lines[i].rstrip("\n")
    m = HUNK_RE.match(header)
    number = len(fp.hunks) + 1
    if not m:
        raise PatchError(f"{patch_name}: {fp.path} hunk #{number}: bad header {header!r}")
    old_start = int(m.group(1))
    old_count = int(m.group(2)) if m.group(2) is not None else 1
    new_count = int(m.group(4)) if m.group(4) is not None else 1
    hunk = Hunk(number=number, header=header, old_start=old_start)
    i += 1
    seen_old = seen_new = 0
    while i < len(lines) and (seen_old < old_count or seen_new < new_count):
        line = lines[i]
        tag, body = line[:1], line[1:]
        if line == "\n":  # an empty context line whose leading space an editor stripped
            tag, body = " ", "\n"
        if tag == " ":
            hunk.old_lines.append(body)
            hunk.new_lines.append(body)
            seen_old += 1
            seen_new += 1
        elif tag == "-":
            hunk.old_lines.append(body)
            seen_old += 1
        elif tag == "+":
            hunk.new_lines.append(body)
            seen_new += 1
        elif tag == "\\":  # "\ No newline at end of file" refers to the previous line
            _drop_newline(hunk, lines[i - 1][:1])
        else:
            raise PatchError(
                f"{patch_name}: {fp.path} hunk #{number} ({header}): unexpected line {i + 1}: {line!r}"
            )
        i += 1
    if i < len(lines) and lines[i].startswith("\\"):
        _drop_newline(hunk, lines[i - 1][:1])
        i += 1
    if seen_old != old_count or seen_new != new_count:
        raise PatchError(
            f"{patch_name}: {fp.path} hunk #{number} ({header}): truncated, expected {old_count} old and "
            f"{new_count} new lines, found {seen_old} and {seen_new}"
        )
    fp.hunks.append(hunk)
    return i


def _drop_newline(hunk: Hunk, tag: str) -> None:
    targets = {" ": (hunk.old_lines, hunk.new_lines), "-": (hunk.old_lines,), "+": (hunk.new_lines,)}
    for seq in targets.get(tag, ()):
        if seq and seq[-1].endswith("\n"):
            seq[-1] = seq[-1][:-1]


def _find(lines: list[str], want: list[str], expected: int, start: int) -> int | None:
    """Index where `want` matches `lines` exactly, nearest to `expected`, not before `start`."""
    last = len(lines) - len(want)
    if last < start:
        return None
    expected = min(max(expected, start), last)
    if not want:
        return expected
    for delta in range(last - start + 1):
        for pos in (expected - delta, expected + delta):
            if start <= pos <= last and lines[pos : pos + len(want)] == want:
                return pos
    return None


def apply_file_patch(original: str | None, fp: FilePatch, patch_name: str) -> str:
    """Apply one file's hunks to `original` (None: the file does not exist yet) and return the text."""
    if original is None and fp.old_path is not None:
        raise PatchError(f"{patch_name}: {fp.path} does not exist in the installed package")
    if original is not None and fp.old_path is None:
        raise PatchError(f"{patch_name}: creates {fp.path}, but that file already exists")
    lines = (original or "").splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    for hunk in fp.hunks:
        expected = max(hunk.old_start - 1, 0) if hunk.old_lines else hunk.old_start
        pos = _find(lines, hunk.old_lines, expected, cursor)
        if pos is None:
            raise PatchError(
                f"{patch_name}: hunk #{hunk.number} ({hunk.header}) does not apply to {fp.path}: "
                f"{_mismatch(lines, hunk, expected)}"
            )
        out.extend(lines[cursor:pos])
        out.extend(hunk.new_lines)
        cursor = pos + len(hunk.old_lines)
    out.extend(lines[cursor:])
    return "".join(out)


def _mismatch(lines: list[str], hunk: Hunk, expected: int) -> str:
    """Say which expected line differs at the hunk's stated position, to make the fix obvious."""
    for k, want in enumerate(hunk.old_lines):
        have = lines[expected + k] if expected + k < len(lines) else "<end of file>"
        if have != want:
            return f"line {expected + k + 1} is {have.rstrip()!r}, the patch expects {want.rstrip()!r}"
    return "its lines were found only before an earlier hunk (hunks out of order)"
