"""What the rehearsal engine says: canned answers only where configured, else filler."""

from __future__ import annotations

import json

import pytest

from pd_standins.engine.text import (
    BUILTIN_CANNED,
    CannedCompletions,
    CannedCompletionsError,
    complete,
    filler_tokens,
    split_tokens,
)

PROBE = "The capital of France is"


def test_unconfigured_simulator_fails_the_correctness_probe() -> None:
    result = complete(PROBE, 16, CannedCompletions())
    text = "".join(result.tokens)
    assert "Paris" not in text
    assert len(result.tokens) == 16 and result.finish_reason == "length" and not result.canned


def test_filler_is_deterministic_per_prompt() -> None:
    assert filler_tokens("a", 8) == filler_tokens("a", 8)
    assert filler_tokens("a", 8) != filler_tokens("b", 8)


def test_canned_answer_stops_unless_ignore_eos() -> None:
    canned = CannedCompletions.from_mapping({PROBE: " Paris."})
    result = complete(PROBE + " (answer in one word)", 16, canned)
    assert "".join(result.tokens) == " Paris." and result.finish_reason == "stop"
    padded = complete(PROBE, 5, canned, ignore_eos=True)
    assert len(padded.tokens) == 5 and padded.tokens[0] == " Paris." and padded.finish_reason == "length"


def test_canned_answer_is_cut_at_max_tokens() -> None:
    canned = CannedCompletions.from_mapping({"Q": " one two three"})
    result = complete("Q", 2, canned)
    assert result.tokens == (" one", " two") and result.finish_reason == "length"


def test_longest_prefix_wins_and_leading_space_is_ignored() -> None:
    canned = CannedCompletions.from_mapping({"The": " short", PROBE: " Paris"})
    assert canned.match("  " + PROBE) == " Paris"
    assert canned.match("The end") == " short"
    assert canned.match("Nothing") is None


def test_split_tokens_round_trips() -> None:
    text = " Paris. is  the capital"
    assert "".join(split_tokens(text)) == text


def test_load_merges_file_and_inline_json(tmp_path) -> None:
    path = tmp_path / "canned.json"
    path.write_text(json.dumps({"A": " from file", "B": " b"}))
    canned = CannedCompletions.load(str(path), json.dumps({"A": " inline"}))
    assert canned.as_dict() == {**BUILTIN_CANNED, "A": " inline", "B": " b"}


def test_builtin_answer_to_the_validation_probe_says_it_is_canned() -> None:
    answer = CannedCompletions.load().match(PROBE)
    assert answer is not None and "Paris" in answer and "canned" in answer
    override = CannedCompletions.load(None, json.dumps({PROBE: " Lyon"}))
    assert override.match(PROBE) == " Lyon"


@pytest.mark.parametrize("bad", ['["not", "a", "mapping"]', '{"": "x"}', '{"A": 1}', "not json"])
def test_bad_canned_completions_name_the_source(bad: str) -> None:
    with pytest.raises(CannedCompletionsError, match="PD_SIM_CANNED_COMPLETIONS_JSON"):
        CannedCompletions.load(None, bad)


def test_missing_canned_file_names_the_flag(tmp_path) -> None:
    with pytest.raises(CannedCompletionsError, match="--sim-canned-completions"):
        CannedCompletions.load(str(tmp_path / "absent.json"))
