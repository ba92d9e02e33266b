"""A deadline that never swallows a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the awaited operation completes in
the same loop iteration as a cancellation of the caller, and the cancellation is lost (CPython
gh-86296, fixed in 3.12 by rewriting wait_for on ``asyncio.timeout``). In the engine that lost a
client's disconnect: aiohttp cancels the handler of a closed connection (handler_cancellation), the
cancel landed while the decode's bootstrap connection was completing, and the abandoned decode leg
waited for its room until SGLANG_DISAGGREGATION_WAITING_TIMEOUT. ``asyncio.timeout`` (3.11+) and
async-timeout (aiohttp's own dependency before 3.11) keep the cancellation.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable
from typing import TypeVar

if sys.version_info >= (3, 11):
    from asyncio import timeout as _timeout
else:  # pragma: no cover - aiohttp installs async-timeout on Python 3.10
    from async_timeout import timeout as _timeout

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """Await `awaitable` for at most `timeout_s` seconds (asyncio.TimeoutError after), keeping a
    cancellation of the caller that arrives as it completes."""
    async with _timeout(max(timeout_s, 0.0)):
        return await awaitable
