"""The one polling loop: look, stop when what was seen is settled or the time is spent.

The serving waits (a program RUNNING and healthy, the appliance ready, a restarted program
answering on its new release) differ only in what they look at and what counts as settled; the
clock and the sleep are parameters so their tests run without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

Seen = TypeVar("Seen")


@dataclass(frozen=True)
class Polled(Generic[Seen]):
    """The last look, how long the wait took, and whether it ended settled or at the deadline."""

    seen: Seen
    waited_s: float
    settled: bool


def poll(
    look: Callable[[], Seen],
    settled: Callable[[Seen], bool],
    timeout_s: float,
    interval_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Polled[Seen]:
    """Look at once, then every `interval_s`, until `settled(seen)` or `timeout_s` has passed.

    A timeout of 0 looks exactly once: the caller asked "now", not "wait".
    """
    start = clock()
    while True:
        seen = look()
        waited_s = clock() - start
        done = settled(seen)
        if done or waited_s >= timeout_s:
            return Polled(seen, waited_s, done)
        sleep(interval_s)
