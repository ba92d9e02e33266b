"""The one error type of pd_appliance.release: a message that names what was seen and the fix."""

from __future__ import annotations


class ReleaseError(Exception):
    """A release cannot be recorded, accepted, rolled back or pruned; `message` says why and how to fix it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
