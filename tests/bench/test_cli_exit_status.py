"""`pd-bench run` exits non-zero when a level's failed share exceeds --max-error-rate (default 0)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pd_appliance.bench.cli import main

DOUBLE = Path(__file__).resolve().parent / "openai_stream_double.py"


@contextmanager
def _double(*args: str) -> Iterator[str]:
    """The OpenAI streaming test double in its own process; yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, str(DOUBLE), "--port", "0", *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _run(url: str, *extra: str) -> int:
    return main(["run", "--url", url, "--model", "m", "--concurrency", "2", "--num-requests", "4",
                 "--warmup-requests", "0", "--input-len", "8", "--output-len", "4", *extra])  # fmt: skip


def test_every_request_answered_exits_0() -> None:
    with _double() as url:
        assert _run(url) == 0


def test_one_failed_request_exits_1_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    with _double("--fail-requests", "3") as url:  # request 1 is the probe, 2-5 are measured
        assert _run(url) == 1
    assert "C=2: 1 of 4 requests failed (25.0%), above --max-error-rate 0" in capsys.readouterr().err


def test_a_failed_share_within_the_limit_exits_0() -> None:
    with _double("--fail-requests", "3") as url:
        assert _run(url, "--max-error-rate", "0.25") == 0
    with _double("--fail-requests", "3,4") as url:
        assert _run(url, "--max-error-rate", "0.25") == 1


def test_a_failed_probe_still_exits_2() -> None:
    with _double("--probe-answer", "Berlin") as url:
        assert _run(url) == 2


@pytest.mark.parametrize("value", ["-0.1", "1.5", "half"])
def test_the_limit_must_be_a_fraction(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--url", "http://127.0.0.1:1", "--max-error-rate", value])
    assert exc.value.code == 2 and "expected a fraction of requests from 0 to 1" in capsys.readouterr().err
