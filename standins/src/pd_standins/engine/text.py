"""What the simulator says: canned completions, else deterministic filler.

The filler is chosen so that a correctness probe cannot pass by accident: only a canned entry
configured by the operator (the rehearsal inventory) makes "The capital of France is" answer
"Paris".
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

FILLER_WORDS = (
    "simulated", "token", "rehearsal", "filler", "from", "pd-sim-worker", "no", "model", "ran",
    "here", "this", "text", "is", "deterministic", "placeholder", "output",
)  # fmt: skip
_TOKEN_RE = re.compile(r"\s*\S+|\s+$")


# What the engine answers by default: the validation stage's correctness probe (roles/validation,
# validation_probe_prompt) gets the answer a working model gives, marked as canned, so the rehearsal
# runs the lab's probe unchanged. A file or inline JSON adds to it or overrides it.
BUILTIN_CANNED = {
    "The capital of France is": " Paris. (canned by the rehearsal engine, not a model's answer)"
}


class CannedCompletionsError(ValueError):
    """A canned-completions source is unreadable or not a prefix -> continuation mapping."""


def split_tokens(text: str) -> list[str]:
    """Split text into word-sized pieces that keep their leading whitespace, so "".join() round-trips."""
    return _TOKEN_RE.findall(text)


def count_prompt_tokens(prompt: str) -> int:
    """Rough token count (4 characters a token), at least 1: what usage.prompt_tokens reports."""
    return max(1, (len(prompt) + 3) // 4)


@dataclass(frozen=True)
class CannedCompletions:
    """Prompt prefix -> continuation; the longest matching prefix wins."""

    entries: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, str], source: str = "mapping") -> CannedCompletions:
        if not isinstance(mapping, Mapping):
            raise CannedCompletionsError(
                f"canned completions from {source} must be a JSON object mapping a prompt prefix to a "
                f"continuation, got {type(mapping).__name__}"
            )
        entries = []
        for prefix, continuation in mapping.items():
            if not isinstance(prefix, str) or not prefix or not isinstance(continuation, str):
                raise CannedCompletionsError(
                    f"canned completions from {source}: entry {prefix!r} must map a non-empty string "
                    f"to a string"
                )
            entries.append((prefix, continuation))
        entries.sort(key=lambda item: len(item[0]), reverse=True)
        return cls(tuple(entries))

    @classmethod
    def load(cls, path: str | None = None, inline_json: str | None = None) -> CannedCompletions:
        """The built-in answers, then a JSON file, then an inline JSON string (later wins); both optional."""
        merged: dict[str, str] = dict(BUILTIN_CANNED)
        for source, text in _sources(path, inline_json):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise CannedCompletionsError(f"canned completions from {source} are not JSON: {exc}") from exc
            merged.update(cls.from_mapping(data, source).as_dict())
        return cls.from_mapping(merged)

    def as_dict(self) -> dict[str, str]:
        return dict(self.entries)

    def match(self, prompt: str) -> str | None:
        stripped = prompt.lstrip()
        for prefix, continuation in self.entries:
            if stripped.startswith(prefix):
                return continuation
        return None


def _sources(path: str | None, inline_json: str | None) -> Iterable[tuple[str, str]]:
    if path:
        try:
            yield path, Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CannedCompletionsError(
                f"cannot read canned completions file {path}: {exc.strerror} "
                f"(fix --sim-canned-completions / PD_SIM_CANNED_COMPLETIONS)"
            ) from exc
    if inline_json:
        yield "PD_SIM_CANNED_COMPLETIONS_JSON", inline_json


def filler_tokens(prompt: str, count: int) -> list[str]:
    """`count` deterministic filler tokens; the same prompt always gives the same text."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:4], "big")
    return [" " + FILLER_WORDS[(seed + i) % len(FILLER_WORDS)] for i in range(count)]


@dataclass(frozen=True)
class Completion:
    tokens: tuple[str, ...]
    finish_reason: str  # "stop" or "length"
    canned: bool


def complete(prompt: str, max_tokens: int, canned: CannedCompletions, ignore_eos: bool = False) -> Completion:
    """Decide the whole output up front; the server only paces it."""
    max_tokens = max(0, int(max_tokens))
    answer = canned.match(prompt)
    if answer is None:
        return Completion(tuple(filler_tokens(prompt, max_tokens)), "length", canned=False)
    tokens = split_tokens(answer)
    if ignore_eos and len(tokens) < max_tokens:
        tokens += filler_tokens(prompt, max_tokens - len(tokens))
    finish = "length" if len(tokens) > max_tokens or ignore_eos else "stop"
    return Completion(tuple(tokens[:max_tokens]), finish, canned=True)
