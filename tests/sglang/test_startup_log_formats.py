"""The start-up log statements the parser reads are the pinned wheel's, word for word.

pd_appliance.serving.startup_log and the rehearsal engine (pd_standins.engine.startup_log) read and
write SGLang 0.5.23's own log lines. This reads the real wheel: every fragment the tests build lines
from (tests/startup_log_lines.py) is in the file it is cited from, and every source file the
parser cites exists, so an SGLang upgrade that rewords a line fails here instead of the record
silently losing a choice or a fallback.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pd_appliance.serving import startup_log
from startup_log_lines import LOGGER_FORMAT, STATEMENTS


def _source(wheel: zipfile.ZipFile, path: str) -> str:
    return wheel.read(f"sglang/{path}").decode()


@pytest.mark.parametrize(("key", "path", "fragments"), [(k, f, frags) for k, f, frags, _t in STATEMENTS])
def test_each_statement_is_in_the_wheel_as_cited(
    sglang_wheel: Path, key: str, path: str, fragments: list[str]
) -> None:
    with zipfile.ZipFile(sglang_wheel) as wheel:
        source = _source(wheel, path)
    missing = [fragment for fragment in fragments if fragment not in source]
    assert not missing, f"{key}: sglang/{path} no longer says {missing}"


def test_the_logger_format_is_the_wheels(sglang_wheel: Path) -> None:
    with zipfile.ZipFile(sglang_wheel) as wheel:
        missing = [
            (path, fragment) for path, fragment in LOGGER_FORMAT if fragment not in _source(wheel, path)
        ]
    assert not missing


def test_every_source_the_parser_cites_is_in_the_wheel(sglang_wheel: Path) -> None:
    cited = {source.split()[0] for _key, _pattern, source in startup_log.CHOICES}
    cited |= {fallback.source.split()[0] for fallback in startup_log.FALLBACKS}
    cited = {path for path in cited if path.startswith("srt/")}
    with zipfile.ZipFile(sglang_wheel) as wheel:
        names = set(wheel.namelist())
    assert cited and not [path for path in cited if f"sglang/{path}" not in names]
