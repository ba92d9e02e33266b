"""What the simulator says: canned completions, else deterministic filler; and how it counts tokens.

The filler is chosen so that a correctness probe cannot pass by accident: only a canned entry
configured by the operator (the rehearsal inventory) makes "The capital of France is" answer
"Paris".

Tokens: when the model directory holds a tokenizer.json (the rehearsal checkpoint carries one, see
pd_standins.hub) the engine counts prompt tokens with it and streams its output one tokenizer
token per chunk, so usage, /metrics and a token-exact client agree; without one it falls back to
about 4 characters a prompt token and word-sized output pieces.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILLER_WORDS = (
    "simulated", "token", "rehearsal", "filler", "from", "pd-sim-worker", "no", "model", "ran",
    "here", "this", "text", "is", "deterministic", "placeholder", "output",
)  # fmt: skip
_TOKEN_RE = re.compile(r"\s*\S+|\s+$")
log = logging.getLogger("pd_sim_worker")


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
    """Rough token count (4 characters a token), at least 1: the count without a tokenizer."""
    return max(1, (len(prompt) + 3) // 4)


@dataclass(frozen=True)
class TokenCounter:
    """Counts and splits text with the model directory's tokenizer.json, or roughly without one.

    SGLang reports usage.prompt_tokens from its tokenizer; so does the engine when the checkpoint
    has one, which is what makes a token-exact client's input length and the engine's
    sglang:prompt_tokens_total agree.
    """

    tokenizer: Any = None
    source: str = "no tokenizer.json: about 4 characters a prompt token, word-sized output pieces"
    _cache: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def for_model(cls, model_path: str | None) -> TokenCounter:
        """The tokenizer.json of `model_path` (a directory), when there is one and it loads."""
        if not model_path:
            return cls()
        path = Path(model_path) / "tokenizer.json"
        if not path.is_file():
            return cls()
        try:
            from tokenizers import Tokenizer
        except ImportError:
            return cls(source=f"{path} exists but the tokenizers package is missing: counting roughly")
        try:
            return cls(Tokenizer.from_file(str(path)), f"tokenizer {path}")
        except Exception as exc:  # a broken file must not stop the engine; the log says why
            log.warning("cannot load %s (%s): counting tokens roughly", path, exc)
            return cls(source=f"{path} does not load ({exc}): counting roughly")

    def count(self, text: str) -> int:
        """Prompt tokens, at least 1 (SGLang rejects an empty prompt before it counts)."""
        if self.tokenizer is None:
            return count_prompt_tokens(text)
        return max(1, len(self.tokenizer.encode(text, add_special_tokens=False).ids))

    def pieces(self, text: str) -> list[str]:
        """`text` as the chunks the engine streams: one tokenizer token each (word-sized without a
        tokenizer); "".join() gives `text` back. A token whose bytes are not text on their own (a
        split multi-byte character) keeps the word-sized split for that text."""
        if self.tokenizer is None:
            return split_tokens(text)
        cached = self._cache.get(text)
        if cached is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
            parts = [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]
            cached = tuple(parts) if "".join(parts) == text else tuple(split_tokens(text))
            if len(self._cache) < 1024:
                self._cache[text] = cached
        return list(cached)


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


def filler_tokens(prompt: str, count: int, counter: TokenCounter | None = None) -> list[str]:
    """`count` deterministic filler tokens; the same prompt always gives the same text. With a
    tokenizer each is one of its tokens (a filler word may take several)."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:4], "big")
    if counter is None or counter.tokenizer is None:
        return [" " + FILLER_WORDS[(seed + i) % len(FILLER_WORDS)] for i in range(count)]
    out: list[str] = []
    i = 0
    while len(out) < count:
        out += counter.pieces(" " + FILLER_WORDS[(seed + i) % len(FILLER_WORDS)])
        i += 1
    return out[:count]


@dataclass(frozen=True)
class Completion:
    tokens: tuple[str, ...]
    finish_reason: str  # "stop" or "length"
    canned: bool


def complete(
    prompt: str,
    max_tokens: int,
    canned: CannedCompletions,
    ignore_eos: bool = False,
    counter: TokenCounter | None = None,
) -> Completion:
    """Decide the whole output up front; the server only paces it."""
    max_tokens = max(0, int(max_tokens))
    answer = canned.match(prompt)
    if answer is None:
        return Completion(tuple(filler_tokens(prompt, max_tokens, counter)), "length", canned=False)
    tokens = counter.pieces(answer) if counter is not None else split_tokens(answer)
    if ignore_eos and len(tokens) < max_tokens:
        tokens += filler_tokens(prompt, max_tokens - len(tokens), counter)
    finish = "length" if len(tokens) > max_tokens or ignore_eos else "stop"
    return Completion(tuple(tokens[:max_tokens]), finish, canned=True)
