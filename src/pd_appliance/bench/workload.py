"""The fixed workload: request shape, lengths, counts, and synthetic prompts of exact length."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# Plain English words: every common tokenizer maps each to one or two tokens, so a prompt
# built from them is close to its target length before the exact trim.
_WORD_TEXT = """
the of and to in is was for on that with as by at from his her an which have are were be this had
not but one they their all been has when who will more no if out so said what up its about into than
them can only other new some could time these two may then do first any my now such like our over
man me even most made after also did many before must through back years where much your way well
down should because each just those people how too little state good very make world still own see
men work long get here between both life being under never
"""
_WORDS = tuple(_WORD_TEXT.split())


class TokenizerLike(Protocol):
    """The part of a `tokenizers.Tokenizer` the prompt builder needs."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> Any: ...

    def decode(self, ids: list[int]) -> str: ...


class WorkloadError(ValueError):
    """A workload that cannot be run as given; the message names the setting to fix."""


@dataclass(frozen=True)
class Workload:
    """One measured phase: `num_requests` closed-loop requests at `concurrency`."""

    concurrency: int
    num_requests: int
    input_len: int
    output_len: int
    warmup_requests: int
    api: str = "completions"
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.api not in API_PATHS:
            raise WorkloadError(f"api must be one of {sorted(API_PATHS)}, got {self.api!r}")
        for name in ("concurrency", "num_requests", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.output_len < 2:
            raise WorkloadError("output_len must be >= 2: TPOT excludes the first token")
        if self.warmup_requests < 0:
            raise WorkloadError(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        if self.request_timeout_s <= 0:
            raise WorkloadError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_tokenizer(path: str | None, required: bool = True) -> TokenizerLike | None:
    """Load a Hugging Face `tokenizer.json` with the `tokenizers` library, if both exist.

    Returns None when no path is given, or when `required` is false and the path or the library
    is missing (the report then says "characters"). Otherwise a path that cannot be used raises
    WorkloadError, because silently falling back to characters would change what is measured.
    """
    if not path:
        return None
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        if not required:
            return None
        raise WorkloadError(f"tokenizer {file} does not exist: point --tokenizer at a tokenizer.json")
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found]
    except ImportError as exc:
        if not required:
            return None
        raise WorkloadError(
            "a tokenizer was given but the 'tokenizers' package is missing: install it into this venv "
            "or drop the tokenizer to measure input length in characters"
        ) from exc
    return Tokenizer.from_file(str(file))


def _words(rng: random.Random, approx_chars: int) -> str:
    parts: list[str] = []
    length = 0
    while length < approx_chars:
        word = rng.choice(_WORDS)
        parts.append(word)
        length += len(word) + 1
    return " ".join(parts)


def synthetic_prompt(index: int, length: int, tokenizer: TokenizerLike | None, seed: int = 0) -> str:
    """A prompt of exactly `length` tokens (with a tokenizer) or characters (without one).

    Each request index gets different words from its first one on, so the server's prefix cache
    cannot turn a measured prefill into a cache hit.
    """
    rng = random.Random(seed * 1_000_003 + index)
    if tokenizer is None:
        return _words(rng, length + 16)[:length]
    text = _words(rng, length * 8 + 16)
    ids = list(tokenizer.encode(text, add_special_tokens=False).ids)[:length]
    for _ in range(8):
        text = tokenizer.decode(ids)
        count = len(tokenizer.encode(text, add_special_tokens=False).ids)
        if count == length:
            return text
        # Decoding and re-encoding can merge or split tokens at the cut; nudge and retry.
        ids = ids[: length - (count - length)] if count > length else ids + ids[: length - count]
    raise WorkloadError(f"could not build a prompt of exactly {length} tokens with this tokenizer")


def prompt_length(text: str, tokenizer: TokenizerLike | None) -> int:
    return len(text) if tokenizer is None else len(tokenizer.encode(text, add_special_tokens=False).ids)
