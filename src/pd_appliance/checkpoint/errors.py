"""Errors the checkpoint code raises. Each message names the file or variable at fault and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field


class CheckpointError(Exception):
    """A checkpoint problem that the operator must fix; the message says what and how."""

    def __init__(self, message: str, *, details: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, object] = details or {}


@dataclass(frozen=True)
class FileProblem:
    """One file that failed verification: what is wrong, and the hashes when they were compared."""

    path: str
    problem: str
    expected_sha256: str | None = None
    actual_sha256: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def describe(self) -> str:
        text = f"{self.path}: {self.problem}"
        if self.expected_sha256 or self.actual_sha256:
            text += (
                f" (expected sha256 {self.expected_sha256 or '?'}, actual sha256 {self.actual_sha256 or '?'})"
            )
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "problem": self.problem,
            "expected_sha256": self.expected_sha256,
            "actual_sha256": self.actual_sha256,
            **self.extra,
        }


class CheckpointIntegrityError(CheckpointError):
    """Files on disk do not match what they must be, and fetching did not (or may not) repair them."""

    def __init__(self, headline: str, problems: list[FileProblem]) -> None:
        lines = [headline, *(f"  - {p.describe()}" for p in problems)]
        super().__init__("\n".join(lines), details={"problems": [p.as_dict() for p in problems]})
        self.problems = problems
