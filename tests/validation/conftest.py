"""Fixtures for the validation play tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validation_play_helpers import DoubleProcess


@pytest.fixture
def start_double() -> Iterator[Callable[..., DoubleProcess]]:
    """Start OpenAI test doubles (each in its own process); all are stopped after the test."""
    started: list[DoubleProcess] = []

    def start(*args: str) -> DoubleProcess:
        started.append(DoubleProcess(*args))
        return started[-1]

    yield start
    for double in started:
        double.stop()
