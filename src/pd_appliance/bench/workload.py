"""The fixed workload: request shape, lengths, counts, and synthetic prompts of exact length."""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# The checked-in prompt corpus (corpus/prompts.txt): natural English passages, so a draft model's
# acceptance under speculative decoding is what real text gets, and the same in every run.
CORPUS_FILE = "prompts.txt"


class TokenizerLike(Protocol):
    """The part of a `tokenizers.Tokenizer` the prompt builder needs."""

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> Any: ...

    def decode(self, ids: list[int]) -> str: ...


# The correctness probe's defaults (runner.ProbeSpec; the CLI's flags): a prompt any healthy model
# completes with the expected word.
PROBE_PROMPT = "The capital of France is"
PROBE_EXPECT = "Paris"
PROBE_API = "completions"


class WorkloadError(ValueError):
    """A workload that cannot be run as given; the message names the setting to fix."""


@dataclass(frozen=True)
class Workload:
    """One measured level: a closed loop at `concurrency`, warmed up, then measured in waves.

    It stops after at least `num_requests` measured requests, `min_waves` waves of `concurrency`
    completions and `min_measure_s` seconds of measured time (pd_appliance.bench.steady). Requests
    are greedy (temperature 0) with ignore_eos; `thinking` is the chat template's thinking mode
    (chat API only), off by default so a reasoning preamble cannot change the output's text.
    """

    concurrency: int
    num_requests: int
    input_len: int
    output_len: int
    warmup_requests: int
    api: str = "completions"
    request_timeout_s: float = 600.0
    min_measure_s: float = 0.0
    min_waves: int = 1
    thinking: bool = False

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
        if self.min_waves < 1:
            raise WorkloadError(f"min_waves must be >= 1, got {self.min_waves}")
        if self.min_measure_s < 0:
            raise WorkloadError(f"min_measure_s must be >= 0, got {self.min_measure_s}")
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
        from tokenizers import Tokenizer
    except ImportError as exc:
        if not required:
            return None
        raise WorkloadError(
            "a tokenizer was given but the 'tokenizers' package is missing: install it into this venv "
            "or drop the tokenizer to measure input length in characters"
        ) from exc
    tokenizer: TokenizerLike = Tokenizer.from_file(str(file))
    return tokenizer


@functools.lru_cache(maxsize=1)
def load_corpus() -> tuple[str, ...]:
    """The corpus passages: paragraphs of corpus/prompts.txt, '#' comment lines left out."""
    text = resources.files("pd_appliance.bench").joinpath("corpus", CORPUS_FILE).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    passages = [" ".join(p.split()) for p in "\n".join(lines).split("\n\n")]
    return tuple(p for p in passages if p)


@functools.lru_cache(maxsize=1)
def _openings() -> tuple[tuple[int, int], ...]:
    """(passage, character offset) of every word start in the corpus: where a prompt may begin.

    Word starts, not sentence starts: the corpus has a few hundred sentences but thousands of
    words, so a long level (hundreds of requests) still never repeats an opening.
    """
    starts: list[tuple[int, int]] = []
    for number, passage in enumerate(load_corpus()):
        starts += [(number, m.start()) for m in re.finditer(r"\S+", passage)]
    return tuple(starts)


def _stride(count: int) -> int:
    """A step coprime with `count`, near its golden section, so consecutive indices land far apart."""
    step = max(1, round(count * 0.618))
    while math.gcd(step, count) != 1:
        step += 1
    return step


def corpus_text(index: int, approx_chars: int, seed: int = 0) -> str:
    """Request `index`'s text: corpus passages, deterministically, at least `approx_chars` long.

    It opens at a word chosen by a permutation of the corpus's word starts, so no two of any run of
    consecutive indices as long as the corpus has words (2,368: the runner numbers a run's requests
    on across levels, and a run sends far fewer) open at the same place, and
    the passages after it follow in an order drawn from (seed, index). Two prompts share at most
    the few tokens two different places in the corpus happen to share (as the random words before
    the corpus did), so the prefix cache cannot serve a measured prefill.
    """
    corpus = load_corpus()
    starts = _openings()
    passage, offset = starts[(seed + index * _stride(len(starts))) % len(starts)]
    rng = random.Random(seed * 1_000_003 + index)
    parts = [corpus[passage][offset:]]
    length = len(parts[0])
    while length < approx_chars:
        order = rng.sample(range(len(corpus)), len(corpus))
        for number in order:
            if length >= approx_chars:
                break
            if number != passage:
                parts.append(corpus[number])
                length += len(corpus[number]) + 2
    return "\n\n".join(parts)


def synthetic_prompt(index: int, length: int, tokenizer: TokenizerLike | None, seed: int = 0) -> str:
    """Prompt `index`: corpus text cut to exactly `length` tokens (with a tokenizer) or characters.

    Built from the checked-in corpus (corpus_text), so the same index gives the same prompt in
    every run, and each differs from the others from its start (no prefix-cache hit).
    """
    if tokenizer is None:
        return corpus_text(index, length + 16, seed)[:length]
    text = corpus_text(index, length * 8 + 16, seed)
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
